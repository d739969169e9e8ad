"""A step addressed by its id and its run is sought by its id on PostgreSQL.

Every statement that addresses one step names its run too (one shard where the
tables are distributed by run). An index that leads with the run, if the
planner takes one for the two equalities, must bound the step's id too: in a
fan-out run of a thousand live steps that the planner has no statistics for
(a new run), an index sought by the run alone reads every live step of the
run for each claim, outcome and renewal. The attempt row written beside the
step is sought by its key too, never found among the run's attempts. Checked
by statement name, on the custom plan and on the generic one a prepared
statement settles on.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg

from pikku_celery.engine.passes import take_pass
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import Decision, NewRun, NewStep, StepKind, migrate
from pikku_celery.store.sql_for import store_for
from tests.scale_statements import bind, sample
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

LIVE_STEPS = 1000
ENDED = 300
"""Steps of the run claimed and completed first: the run's attempts."""
TASK = "tasks.work"
STEP_ADDRESSED = [
    "claim",
    "claim_view",
    "claim_view_durable",
    "step_get",
    "step_task_name",
    "renew",
    "renew_counted_cte",
    "park",
    "expire",
    "fenced_step[complete]",
    "fenced_cte[complete]",
    "fenced_cte_at[fail_retry]",
    "resolve",
    "pass_write[complete,step]",
    "pass_write[fail_retry,step,eager]",
]
RUN_LED = {"ix_pikku_step_live_run", "uq_pikku_step_run_name"}
"""The step indexes whose first column is the run."""
BY_ID = re.compile(r"\(id\)::text = ")
"""An index condition on the step's own id (``(run_id)`` does not match)."""
STEP_SCAN = re.compile(r"Scan(?: using (\w+))? on pikku_workflow_step(?: (\w+))?\s")
PLAN_MODES = ("force_custom_plan", "force_generic_plan")


@pytest.fixture(scope="module")
def big_run() -> Iterator[tuple[sa.Engine, dict[str, Any]]]:
    """A run of LIVE_STEPS steps, ENDED of them run to success and the rest
    scheduled, never ANALYZEd."""
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_fanout") as url:
        migrate.upgrade(url)
        engine = make_engine(url, pool_size=1, max_overflow=0)
        store = store_for(engine)
        run, _ = store.create_run(NewRun("wf", {}))
        steps = [
            NewStep(name=f"s{i}", seq=i, kind=StepKind.TASK, task_name=TASK)
            for i in range(LIVE_STEPS)
        ]
        take_pass(store, run.id, None, lambda view: Decision(new_steps=steps))
        for step in store.get_steps(run.id)[:ENDED]:
            claimed = store.claim_step(step.id, TASK, "w", 60_000, run_id=run.id)
            assert claimed is not None
            store.complete_step(step.id, claimed.attempt, "ok", run_id=run.id)
        with engine.connect() as conn:
            found = sample(conn)
        yield engine, {"p_id": found.step_id, "p_run": run.id, "sample": found}
        engine.dispose()


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _plan(engine: sa.Engine, name: str, keys: dict[str, Any], mode: str) -> str:
    """EXPLAIN of the statement prepared, under ``plan_cache_mode = mode``."""
    stmt = store_for(engine).statements.named()[name]
    params = {**bind(stmt, name, keys["sample"]), "p_id": keys["p_id"], "p_run": keys["p_run"]}
    compiled: Any = stmt.compile(dialect=psycopg.dialect(paramstyle="numeric_dollar"))
    args = ", ".join(_literal(params.get(k, compiled.binds[k].value)) for k in compiled.positiontup)
    with engine.connect() as conn:
        conn.exec_driver_sql(f"SET plan_cache_mode = {mode}")
        conn.exec_driver_sql(f"PREPARE probe AS {compiled}")
        try:
            rows = conn.exec_driver_sql(f"EXPLAIN EXECUTE probe({args})").all()
        finally:
            conn.exec_driver_sql("DEALLOCATE probe")
            conn.rollback()
    return "\n".join(row[0] for row in rows)


def _step_scans(plan: str) -> list[tuple[str, str]]:
    """How each write (or the lone read) of a step row reaches it: the index
    and its condition (empty for none)."""
    lines = plan.splitlines()
    found = []
    for i, line in enumerate(lines):
        if re.search(r"Update on pikku_workflow_step(?!_attempt)\b", line) or (
            i == 0 and STEP_SCAN.search(line + " ")
        ):
            at = next(j for j in range(i, len(lines)) if STEP_SCAN.search(lines[j] + " "))
            match = STEP_SCAN.search(lines[at] + " ")
            assert match is not None
            cond = lines[at + 1] if at + 1 < len(lines) and "Index Cond" in lines[at + 1] else ""
            found.append((match.group(1) or "(no index)", cond))
    return found


@pytest.mark.parametrize("mode", PLAN_MODES)
@pytest.mark.parametrize("name", STEP_ADDRESSED)
def test_a_step_of_a_big_new_run_is_sought_by_its_id(
    big_run: tuple[sa.Engine, dict[str, Any]], name: str, mode: str
) -> None:
    engine, keys = big_run
    plan = _plan(engine, name, keys, mode)
    scans = _step_scans(plan)
    assert scans, plan
    assert all(BY_ID.search(cond) for index, cond in scans if index in RUN_LED), plan
    # the attempt row it writes beside the step: by its key, not among the run's
    assert "Seq Scan on pikku_workflow_step_attempt" not in plan, plan
