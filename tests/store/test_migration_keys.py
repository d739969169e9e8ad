"""Migration 0014 on a database with rows: keys that carry the run, and
idempotency keys in their own table, up and down on every dialect.

A database at 0013 with a keyed run, its step, attempt, signal and audit
trail is upgraded in place: every row stays (audit ids too), the key names
its run from the new table, the primary keys hold the run, and the store
works on it. Downgraded, it is 0013's schema again with the same rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery.model.values import AuditAction, NewRun, Operator
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import migrate
from pikku_celery.store.sql_for import store_for
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG, scratch_database

RUN = "00000000-0000-4000-8000-000000000001"
OTHER = "00000000-0000-4000-8000-000000000002"
STEP = "00000000-0000-4000-8000-00000000000a"
KEY = "order-42"
PRIMARY_KEYS = {
    "pikku_workflow_step": (["id"], ["id", "run_id"]),
    "pikku_workflow_step_attempt": (["step_id", "attempt"], ["step_id", "attempt", "run_id"]),
    "pikku_workflow_audit": (["id"], ["id", "run_id"]),
}


@pytest.fixture(params=["sqlite", "postgres", "mariadb"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":  # the store's own engine: foreign keys enforced
        made = make_engine(f"sqlite:///{tmp_path}/keys.db")
        yield made
        made.dispose()
        return
    admin = PG_ADMIN_URL if request.param == "postgres" else MYSQL_ADMIN_URL
    with scratch_database(admin, f"{SESSION_TAG}_k{uuid.uuid4().hex[:6]}") as url:
        made = make_engine(url)
        yield made
        made.dispose()


def _fill_at_0013(engine: sa.Engine) -> None:
    statements = [
        "INSERT INTO pikku_workflow_run (id, workflow, status, input, idempotency_key, "
        "cancel_requested, version, sweep_count, created_at, updated_at, depth) VALUES "
        f"('{RUN}', 'wf', 'running', '{{\"n\": 1}}', '{KEY}', false, 1, 0, 5, 5, 0), "
        f"('{OTHER}', 'wf', 'running', 'null', NULL, false, 1, 0, 6, 6, 0)",
        "INSERT INTO pikku_workflow_step (id, run_id, name, seq, kind, status, attempt, "
        "max_attempts, retry_delay, backoff, created_at, updated_at, next_sweep_at, "
        f"sweep_count) VALUES ('{STEP}', '{RUN}', 's', 0, 'task', 'running', 1, 3, 1, 2, "
        "5, 5, 0, 0)",
        "INSERT INTO pikku_workflow_step_attempt (step_id, attempt, run_id, status, "
        f"started_at, renewals) VALUES ('{STEP}', 1, '{RUN}', 'running', 5, 0)",
        "INSERT INTO pikku_workflow_signal (run_id, name, payload, created_at) VALUES "
        f"('{RUN}', 'go', 'true', 5)",
        "INSERT INTO pikku_workflow_audit (run_id, action, actor, details, at) VALUES "
        f"('{RUN}', 'signal', 'ann', '{{}}', 7), ('{RUN}', 'cancel', 'bob', '{{}}', 8)",
    ]
    with engine.begin() as conn:
        for text in statements:
            conn.exec_driver_sql(text)


def _rows(engine: sa.Engine) -> dict[str, list[tuple[object, ...]]]:
    queries = {
        "runs": "SELECT id, idempotency_key FROM pikku_workflow_run ORDER BY id",
        "steps": "SELECT id, run_id, status FROM pikku_workflow_step",
        "attempts": "SELECT step_id, attempt, run_id FROM pikku_workflow_step_attempt",
        "signals": "SELECT run_id, name FROM pikku_workflow_signal",
        "audit": "SELECT id, run_id, action FROM pikku_workflow_audit ORDER BY id",
    }
    with engine.connect() as conn:
        return {name: [tuple(r) for r in conn.exec_driver_sql(q)] for name, q in queries.items()}


def _primary_keys(engine: sa.Engine) -> dict[str, list[str]]:
    inspector = sa.inspect(engine)
    return {t: inspector.get_pk_constraint(t)["constrained_columns"] for t in PRIMARY_KEYS}


def _has_unique_key(engine: sa.Engine) -> bool:
    inspector = sa.inspect(engine)
    found = inspector.get_unique_constraints("pikku_workflow_run")
    found += [i for i in inspector.get_indexes("pikku_workflow_run") if i["unique"]]
    return any(c["column_names"] == ["workflow", "idempotency_key"] for c in found)


def test_0014_upgrades_a_database_with_rows_and_downgrades_it(engine: sa.Engine) -> None:
    migrate.upgrade(engine, "0013")
    _fill_at_0013(engine)
    before = _rows(engine)

    migrate.upgrade(engine)
    assert migrate.check(engine).ok, migrate.check(engine).message
    assert _rows(engine) == before
    assert _primary_keys(engine) == {t: now for t, (_, now) in PRIMARY_KEYS.items()}
    assert not _has_unique_key(engine)
    with engine.connect() as conn:
        keys = conn.exec_driver_sql(
            "SELECT workflow, idempotency_key, run_id, created_at FROM pikku_workflow_run_key"
        ).all()
    assert [tuple(k) for k in keys] == [("wf", KEY, RUN, 5)]
    if engine.dialect.name == "sqlite":  # the rebuilt tables kept their partial indexes
        with engine.connect() as conn:
            live = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'ix_pikku_step_live_run'"
            ).scalar_one()
        assert "WHERE" in live.upper()

    store = store_for(engine)
    run, created = store.create_run(NewRun("wf", {"n": 1}, idempotency_key=KEY))
    assert (run.id, created) == (RUN, False)  # the copied key names its run
    entry = store.record_action(RUN, AuditAction.RETRY, Operator("cy"))
    assert entry.id == 3  # numbered after the kept ids
    assert [e.id for e in store.audit_trail(RUN)] == [1, 2, 3]
    store.close()

    migrate.downgrade(engine, "0013")
    assert _primary_keys(engine) == {t: before for t, (before, _) in PRIMARY_KEYS.items()}
    assert _has_unique_key(engine)
    assert "pikku_workflow_run_key" not in sa.inspect(engine).get_table_names()
    after = _rows(engine)
    assert after["audit"] == [*before["audit"], (3, RUN, "retry")]
    assert {k: v for k, v in after.items() if k != "audit"} == {
        k: v for k, v in before.items() if k != "audit"
    }

    migrate.upgrade(engine)  # and up again
    assert migrate.check(engine).ok
