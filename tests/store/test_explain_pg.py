"""Every sweep query is served by an index on PostgreSQL (no table scans).

A scratch database gets a realistic mix (thousands of settled steps and
finished runs, a few in flight) and ``ANALYZE``, so the planner chooses on
real statistics; ``enable_seqscan`` is left on. Each query's plan must name
the index that serves it and contain no sequential scan of pikku's tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.sql.schema import run_table, step_table
from pikku_celery.store import migrate
from pikku_celery.store.sql_for import store_for
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

RUNS = 3000
STEPS_PER_RUN = 3
KEYS = 1000


@pytest.fixture(scope="module")
def loaded_engine() -> Iterator[sa.Engine]:
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_explain") as url:
        migrate.upgrade(url)
        engine = sa.create_engine(url)
        _load(engine)
        yield engine
        engine.dispose()


def _load(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        now = int(
            conn.exec_driver_sql("SELECT (extract(epoch from now()) * 1000)::bigint").scalar_one()
        )
    runs: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for i in range(RUNS):
        live = i % 100 == 0  # 1% of runs are still going
        rid = str(uuid.uuid4())
        t = now - (RUNS - i) * 1000
        runs.append(
            {
                "id": rid,
                "workflow": f"wf{i % 7}",
                "idempotency_key": f"key-{i % KEYS}",  # each key used by a few workflows
                "status": "running" if live else "completed",
                "input": "{}",
                "version": 3,
                "cancel_requested": False,
                "sweep_count": 0,
                "created_at": t,
                "updated_at": t + 500,
            }
        )
        for j in range(STEPS_PER_RUN):
            step: dict[str, Any] = {
                "id": str(uuid.uuid4()),
                "run_id": rid,
                "name": f"s{j}",
                "seq": j,
                "kind": "task",
                "status": "succeeded",
                "task_name": "tasks.work",
                "args": "[]",
                "kwargs": "{}",
                "attempt": 1,
                "max_attempts": 3,
                "retry_delay": 0.0,
                "backoff": 1.0,
                "lease_expires_at": None,
                "wake_at": None,
                "scheduled_at": t,
                "created_at": t,
                "updated_at": t + 100,
            }
            if live:
                step.update(
                    [
                        {"status": "running", "lease_expires_at": t + 60_000},
                        {"status": "scheduled", "attempt": 0},
                        {"kind": "sleep", "status": "scheduled", "wake_at": t + 30_000},
                    ][j]
                )
            elif i % 50 == 1 and j == 2:
                step.update(status="failed", wake_at=None)
            steps.append(step)
    with engine.begin() as conn:
        conn.execute(run_table.insert(), runs)
        conn.execute(step_table.insert(), steps)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")


EXPECTED = {
    "lapsed_steps": ["ix_pikku_step_sweep_lease"],
    "undispatched_steps": ["ix_pikku_step_sweep_scheduled"],
    "due_steps": ["ix_pikku_step_sweep_wake"],
    "idle_runs": ["ix_pikku_run_live_updated"],
}
PARAMS = {"p_limit": 100, "p_older_ms": 30_000, "p_idle_ms": 60_000, "p_bound_ms": 7_200_000}


def _plan(engine: sa.Engine, stmt: sa.Select[Any]) -> str:
    bound = stmt.params({k: v for k, v in PARAMS.items()})
    sql = str(bound.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return "\n".join(conn.exec_driver_sql("EXPLAIN " + sql).scalars())


@pytest.mark.parametrize("query", sorted(EXPECTED))
def test_sweep_query_uses_its_index(loaded_engine: sa.Engine, query: str) -> None:
    store = store_for(loaded_engine)
    plan = _plan(loaded_engine, store.sweep_statements()[query])
    for index in EXPECTED[query]:
        assert index in plan, plan
    assert "Seq Scan on pikku_" not in plan, plan
    if query != "idle_runs":
        # bounded by the index on the time column too, not just filtered
        assert "Index Cond" in plan and "<=" in plan.split("Index Cond", 1)[1], plan
        # both ranges of the sweep's backoff are index ranges: steps never
        # re-sent (an equality, so the index keeps their order) and steps
        # whose backoff is over; steps still in backoff are never read
        conds = [line for line in plan.splitlines() if "Index Cond" in line]
        assert any("next_sweep_at = 0" in c for c in conds), plan
        assert any("next_sweep_at > 0" in c and "next_sweep_at <=" in c for c in conds), plan


def test_sweep_queries_return_what_the_data_holds(loaded_engine: sa.Engine) -> None:
    store = store_for(loaded_engine)
    assert len(store.lapsed_steps(1000)) == RUNS // 100
    assert len(store.lapsed_steps(1000, 7_200_000)) == RUNS // 100  # no lease beyond the bound
    assert len(store.undispatched_steps(30_000, 1000)) == RUNS // 100
    assert len(store.due_steps(1000)) == RUNS // 100
    assert store.idle_runs(60_000, 1000) == []


def test_the_search_by_idempotency_key_uses_its_index(loaded_engine: sa.Engine) -> None:
    store = store_for(loaded_engine)
    stmt = store.statements.runs_with_key.params(p_key="key-5", p_limit=50)
    sql = str(stmt.compile(dialect=loaded_engine.dialect, compile_kwargs={"literal_binds": True}))
    with loaded_engine.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + sql).scalars())
    assert "ix_pikku_run_key_created" in plan and "Seq Scan on pikku_" not in plan, plan
    found = store.runs_with_key("key-5")
    assert [r.idempotency_key for r in found] == ["key-5"] * (RUNS // KEYS)
    assert [r.created_at for r in found] == sorted((r.created_at for r in found), reverse=True)


PRUNE_PLANS = {
    "prune_candidates[]": "ix_pikku_run_settled_root",
    "prune_candidates[status]": "ix_pikku_run_settled_root",
    "prune_candidates[status,workflow]": "Index",  # whichever index: the workflow's may win
    "prune_lock_roots": "pikku_workflow_run_pkey",
    "prune_children": "ix_pikku_run_parent",
    "prune_step_ids": "uq_pikku_step_run_name",
    "prune_delete_attempts": "pikku_workflow_step_attempt_pkey",
    "prune_delete_steps": "uq_pikku_step_run_name",
    "prune_delete_audit": "ix_pikku_audit_run",
    "prune_delete_runs": "pikku_workflow_run_pkey",
}


class _Captured(Exception):
    """Raised once the driver's SQL of a statement is in hand: nothing runs."""


def _driver_sql(engine: sa.Engine, stmt: Any, params: dict[str, Any]) -> tuple[str, Any]:
    """The SQL and parameters the driver would be sent for ``stmt`` (a DELETE
    included, whose parameters ``.params()`` cannot bind)."""
    captured: dict[str, Any] = {}

    def grab(*args: Any) -> None:
        captured.update(sql=args[2], params=args[3])
        raise _Captured

    with engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", grab)
        with pytest.raises(Exception):  # noqa: B017 - _Captured, as SQLAlchemy wraps it
            conn.execute(stmt, params)
        conn.rollback()
    return captured["sql"], captured["params"]


@pytest.fixture(scope="module")
def with_history(loaded_engine: sa.Engine) -> sa.Engine:
    """The loaded runs with an attempt row per step and an audit row per run."""
    with loaded_engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO pikku_workflow_step_attempt (step_id, attempt, run_id, status, "
            "started_at, renewals) SELECT id, 1, run_id, 'succeeded', created_at, 0 "
            "FROM pikku_workflow_step ON CONFLICT DO NOTHING"
        )
        conn.exec_driver_sql(
            "INSERT INTO pikku_workflow_audit (run_id, action, actor, at) "
            "SELECT id, 'signal', 'ops', updated_at FROM pikku_workflow_run "
            "WHERE NOT EXISTS (SELECT 1 FROM pikku_workflow_audit)"
        )
    with loaded_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
    return loaded_engine


@pytest.mark.parametrize("name", sorted(PRUNE_PLANS))
def test_retention_statements_use_their_index(with_history: sa.Engine, name: str) -> None:
    """Retention's statements, by name, are index ranges or key lookups."""
    loaded_engine = with_history
    store = store_for(loaded_engine)
    stmt = store.statements.named()[name]
    ids = [str(uuid.uuid4()) for _ in range(5)]  # a batch is a sliver of a large table
    values = {
        "p_cutoff": 2**50,  # every run loaded settled before it
        "p_after_at": 0,
        "p_after_id": "",
        "p_limit": 500,
        "p_status": "completed",
        "p_workflow": "wf1",
        "p_ids": ids,
        "p_step_ids": ids,
    }
    wanted = {k: v for k, v in values.items() if k in stmt.compile().params}
    sql, params = _driver_sql(loaded_engine, stmt, wanted)
    with loaded_engine.connect() as conn:
        plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + sql, params).scalars())
        conn.rollback()
    assert PRUNE_PLANS[name] in plan and "Seq Scan on pikku_" not in plan, plan
    if name in ("prune_candidates[]", "prune_candidates[status]"):  # the cursor bounds the range
        conds = [line for line in plan.splitlines() if "Index Cond" in line]
        assert conds and all(">=" in c and "<=" in c for c in conds), plan
