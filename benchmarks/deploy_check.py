"""The deploy check over many runs in flight: seconds and statements.

    python benchmarks/deploy_check.py [--runs 1000] [--steps 10] [--repeat 5]
                                      [--backends postgres,mariadb,sqlite]

For each database it makes a scratch database (dropped afterwards), migrates
it and writes ``--runs`` runs in flight of a ``--steps``-step workflow (every
step but the last succeeded, the last running), then times
``check_deploy`` (what ``pikku-celery runs check-deploy`` runs) on:

- ``same code``: the body the runs started on (every run replays);
- ``changed code``: a body with a step renamed half-way (every run diverges);
- ``per-run reads``: the same replays over one ``get_run`` + ``get_steps`` +
  ``get_signals`` per run, what the check would cost without its bulk read.

Seconds are the median of ``--repeat`` checks; statements are counted by
SQLAlchemy's ``before_cursor_execute`` hook (SELECTs, and on SQLite the
``BEGIN`` the engine opens each transaction with; the script fails on
anything else). Server
URLs: ``PIKKU_TEST_PG_URL`` / ``PIKKU_TEST_MYSQL_URL`` (admin URLs).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.store import SERVERS, scratch
from pikku_celery.engine import Context, WorkflowEngine
from pikku_celery.engine.deploy_check import DeployCheck, check_deploy, check_run
from pikku_celery.model.values import step_id_for
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.schema import run_table, step_table
from pikku_celery.store import NewRun, RunView, StepKind, StepStatus
from pikku_celery.store.migrate import upgrade
from pikku_celery.store.rows import run_params
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import make_engine as make_test_engine

WORKFLOW = "bench.deploy"
TASK = "bench.step"


def body(steps: int, renamed: int | None = None) -> Callable[[Context, Any], Any]:
    def flow(ctx: Context, n: Any) -> Any:
        return [ctx.step(f"s{k}" if k != renamed else f"renamed{k}", TASK, k) for k in range(steps)]

    return flow


def engine_with(store: SQLWorkflowStore, flow: Callable[[Context, Any], Any]) -> WorkflowEngine:
    engine, dispatcher = make_test_engine(store)
    dispatcher.task(name=TASK)(lambda k: k)
    engine.workflow(flow, name=WORKFLOW)
    return engine


def populate(store: SQLWorkflowStore, runs: int, steps: int, version: str) -> None:
    """``runs`` runs in flight, written in bulk: steps 0..n-2 succeeded, n-1 running."""
    now = store.now_ms()
    run_rows, step_rows = [], []
    for i in range(runs):
        new = NewRun(workflow=WORKFLOW, input=i, workflow_version=version)
        run_rows.append({**run_params(new, json.dumps(i)), "created_at": now, "updated_at": now})
        for k in range(steps):
            last = k == steps - 1
            step_rows.append(
                {
                    "id": step_id_for(new.id, f"s{k}"),
                    "run_id": new.id,
                    "name": f"s{k}",
                    "seq": k,
                    "kind": StepKind.TASK.value,
                    "status": (StepStatus.RUNNING if last else StepStatus.SUCCEEDED).value,
                    "task_name": TASK,
                    "queue": None,
                    "args": json.dumps([k]),
                    "kwargs": "{}",
                    "attempt": 1,
                    "max_attempts": 1,
                    "retry_delay": 1.0,
                    "backoff": 2.0,
                    "lease_expires_at": now + 3_600_000 if last else None,
                    "wake_at": None,
                    "child_run_id": None,
                    "result": None if last else json.dumps(k),
                    "error": None,
                    "worker": "bench",
                    "scheduled_at": now,
                    "created_at": now,
                    "updated_at": now,
                    "route": None,
                    "claim_id": "c" * 32,
                }
            )
    with store.engine.begin() as conn:
        conn.execute(run_table.insert(), run_rows)
        for start in range(0, len(step_rows), 5000):
            conn.execute(step_table.insert(), step_rows[start : start + 5000])


def per_run_check(engine: WorkflowEngine) -> DeployCheck:
    """The check over one read per run: the cost the bulk read avoids."""
    report = DeployCheck()
    store = engine.store
    for listed in store.list_runs(limit=1_000_000):
        if listed.status.terminal:
            continue
        run = store.get_run(listed.id)
        assert run is not None
        view = RunView(run, store.get_steps(run.id), store.get_signals(run.id), store.now_ms())
        report.checked += 1
        found = check_run(engine, view)
        if found is not None:
            report.failing.append(found)
    return report


@contextmanager
def counted(engine: sa.Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)


def measure(
    store: SQLWorkflowStore, check: Callable[[], DeployCheck], repeat: int, failing: int
) -> tuple[float, int]:
    check()  # warm: statements compiled, connections open
    times = []
    statements = 0
    for _ in range(repeat):
        with counted(store.engine) as seen:
            began = time.perf_counter()
            report = check()
            times.append(time.perf_counter() - began)
        assert len(report.failing) == failing, (len(report.failing), failing)
        # SQLite's transactions open with a BEGIN the engine sends itself.
        writes = [s for s in seen if not s.lstrip().upper().startswith(("SELECT", "BEGIN"))]
        assert not writes, writes
        statements = len(seen)
    return statistics.median(times), statements


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as folder:
            yield f"sqlite:///{folder}/deploy.db"
        return
    with scratch(SERVERS[backend]) as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="postgres,mariadb,sqlite")
    args = parser.parse_args()
    rows = []
    for backend in args.backends.split(","):
        with database(backend) as url:
            upgrade(url)
            engine = make_engine(url)
            try:
                store = store_for(engine)
                same = engine_with(store, body(args.steps))
                changed = engine_with(store, body(args.steps, renamed=args.steps // 2))
                populate(store, args.runs, args.steps, same.registry.get(WORKFLOW).version)
                cases: list[tuple[str, Callable[[], DeployCheck], int]] = [
                    ("same code", functools.partial(check_deploy, same), 0),
                    ("changed code", functools.partial(check_deploy, changed), args.runs),
                    ("per-run reads", functools.partial(per_run_check, changed), args.runs),
                ]
                for label, check, failing in cases:
                    seconds, statements = measure(store, check, args.repeat, failing)
                    rows.append((backend, label, args.runs, args.steps, seconds, statements))
            finally:
                engine.dispose()
    print(
        f"{'database':<10} {'check':<14} {'runs':>6} {'steps':>6} {'seconds':>8} {'statements':>11}"
    )
    for backend, label, runs, steps, seconds, statements in rows:
        print(f"{backend:<10} {label:<14} {runs:>6} {steps:>6} {seconds:>8.3f} {statements:>11}")


if __name__ == "__main__":
    main()
