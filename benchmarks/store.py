"""The store's hot path against a raw single-row UPDATE, on the same server.

    python benchmarks/store.py [--n 2000] [--backends postgres,mariadb] [--keyed] [--unnamed]

For each server it makes a scratch database (dropped afterwards), migrates it,
and times, on one thread, rounds of one of each (interleaved, so the load of
a shared machine weighs on all three alike):

- ``UPDATE``: one autocommit single-row ``UPDATE`` by primary key, a pool
  checkout per statement (the yardstick: the cheapest durable write);
- ``claim+complete``: ``claim_step`` then ``complete_step``, each writing the
  step row and its attempt row (DESIGN.md target: <= 3 UPDATE equivalents);
- ``claim+advance``: ``claim_step`` then ``advance`` with the outcome and a
  pass that records the next step or ends the run (the engine's real cycle:
  the run's steps read for the replay, the outcome, the next step, the run).

Each call names the step's run, as the engine does (``--unnamed``: as a
caller that does not, which costs the store a read of the step's run first;
a checkout whose store takes no ``run_id`` there is measured as it is).

With ``--keyed``, three more, each ``create_run`` (the row a start writes
before its first pass): ``start`` without an idempotency key, ``start+key``
with a new key, ``start+key again`` with a key already used (the run it names
read back).

"UPDATE equivalents" = mean cycle time / mean UPDATE time, measured in the
same run. Server URLs: ``PIKKU_TEST_PG_URL`` / ``PIKKU_TEST_MYSQL_URL`` (an
admin URL: the script creates and drops its own database).
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pikku_celery.engine.known_runs import KnownRuns
from pikku_celery.engine.passes import take_pass
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import (
    Decision,
    NewRun,
    NewStep,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
)
from pikku_celery.store.migrate import upgrade
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for

SERVERS = {
    "postgres": os.environ.get(
        "PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get("PIKKU_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
TASK = "bench.step"
BOUND_MS = 7_200_000  # the engine's claim passes its fleet's lease bound (Redis's default)
STEPS_PER_RUN = 10  # the claim+advance runs: replay reads at most this many steps


@contextmanager
def scratch(admin_url: str) -> Iterator[str]:
    name = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    url = sa.make_url(admin_url).set(database=name)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            if url.get_backend_name() == "postgresql":
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                )
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()


def update_op(url: str) -> tuple[Callable[[], None], sa.Engine]:
    """The yardstick: one autocommit single-row UPDATE by primary key."""
    engine = make_engine(url, isolation_level="AUTOCOMMIT")
    meta = sa.MetaData()
    counter = sa.Table(
        "bench_counter",
        meta,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("n", sa.BigInteger, nullable=False),
    )
    meta.create_all(engine)
    with engine.connect() as conn:
        conn.execute(counter.insert(), {"id": 1, "n": 0})
    stmt = counter.update().where(counter.c.id == 1).values(n=counter.c.n + 1)

    def op() -> None:
        with engine.connect() as conn:
            conn.execute(stmt)

    return op, engine


def steps(n: int, start: int = 0) -> list[NewStep]:
    return [
        NewStep(name=f"s{i}", seq=i, kind=StepKind.TASK, task_name=TASK, args=[i])
        for i in range(start, start + n)
    ]


def run_named(method: Callable[..., Any], run_id: str, named: bool) -> dict[str, str]:
    """``run_id=`` for ``method`` when measuring the engine's calls and the
    store's method takes it (an older checkout's may not)."""
    return {"run_id": run_id} if named and "run_id" in inspect.signature(method).parameters else {}


def claim_complete_op(store: SQLWorkflowStore, n: int, named: bool) -> Callable[[], None]:
    """claim_step + complete_step over the steps of one big run."""
    run, _ = store.create_run(NewRun("bench", {}))
    made = Decision(new_steps=steps(n))
    take_pass(store, run.id, None, lambda view: made)
    ids = iter([s.id for s in store.get_steps(run.id)])
    on_claim = run_named(store.claim_step, run.id, named)
    on_complete = run_named(store.complete_step, run.id, named)

    def op() -> None:
        step = store.claim_step(
            next(ids), TASK, "bench-worker", 60_000, bound_ms=BOUND_MS, **on_claim
        )
        assert step is not None
        store.complete_step(step.id, step.attempt, {"ok": True}, **on_complete)

    return op


def claim_advance_op(
    store: SQLWorkflowStore, named: bool
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(prepare, cycle): runs of STEPS_PER_RUN sequential steps; a cycle claims
    the current step, then completes it and records the next in one pass.
    ``prepare`` starts a new run when one is finished (not timed)."""
    state: dict[str, str | None] = {"run": None, "step": None}
    runs = KnownRuns()  # what the engine threads: a pass's run to the next claim

    def decide(view: RunView) -> Decision:
        done = len(view.steps)
        if done >= STEPS_PER_RUN:
            return Decision(run_status=RunStatus.COMPLETED, output={"steps": done})
        return Decision(new_steps=steps(1, done))

    def prepare() -> None:
        if state["step"] is None:
            run, _ = store.create_run(NewRun("bench", {}))
            state["run"] = run.id
            state["step"] = take_pass(store, run.id, None, decide, None, runs).steps[0].id

    def cycle() -> None:
        run_id, step_id = state["run"], state["step"]
        assert run_id is not None and step_id is not None
        known = runs.take(step_id)
        on_claim = run_named(store.claim, run_id, named)
        got = store.claim(
            step_id, TASK, "bench-worker", 60_000, bound_ms=BOUND_MS, known=known, **on_claim
        )
        assert got is not None
        step = got.step
        outcome = StepOutcome(step.id, step.attempt, ok=True, result={"ok": True})
        result = take_pass(store, run_id, outcome, decide, got.view, runs)
        state["step"] = result.steps[0].id if result.steps else None

    return prepare, cycle


def start_ops(store: SQLWorkflowStore) -> list[tuple[str, Callable[[], None]]]:
    """create_run without a key, with a new key, with a key already used."""
    used = f"bench-{uuid.uuid4().hex}"
    store.create_run(NewRun("bench", {}, idempotency_key=used))

    def plain() -> None:
        assert store.create_run(NewRun("bench", {}))[1]

    def keyed() -> None:
        assert store.create_run(NewRun("bench", {}, idempotency_key=uuid.uuid4().hex))[1]

    def again() -> None:
        assert not store.create_run(NewRun("bench", {}, idempotency_key=used))[1]

    return [("start", plain), ("start+key", keyed), ("start+key again", again)]


def measure(
    url: str, n: int, keyed: bool = False, named: bool = True, warmup: int = 200
) -> dict[str, list[float]]:
    """The operations interleaved, one of each per round, so a load spike on
    this shared machine hits them all alike."""
    update, update_engine = update_op(url)
    engine = make_engine(url)
    store = store_for(engine)
    cc = claim_complete_op(store, n + warmup, named)
    prepare, ca = claim_advance_op(store, named)
    ops = [("UPDATE", update), ("claim+complete", cc), ("claim+advance", ca)]
    if keyed:
        ops += start_ops(store)
    times: dict[str, list[float]] = {name: [] for name, _ in ops}
    for i in range(n + warmup):
        prepare()
        for name, op in ops:
            t0 = time.perf_counter()
            op()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    engine.dispose()
    update_engine.dispose()
    return times


def row(name: str, op: str, times: list[float], update_mean: float) -> str:
    mean = statistics.fmean(times)
    median = statistics.median(times)
    return (
        f"| {name:<8} | {op:<15} | {1 / mean:>8,.0f} | {mean * 1e3:>7.3f} | "
        f"{median * 1e3:>9.3f} | {mean / update_mean:>7.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="rounds (one of each operation)")
    parser.add_argument("--backends", default="postgres,mariadb")
    parser.add_argument("--keyed", action="store_true", help="also starts, with and without a key")
    parser.add_argument(
        "--unnamed", action="store_true", help="step calls without run_id (an outside caller)"
    )
    args = parser.parse_args()
    lines = [
        f"n = {args.n} rounds, operations interleaved; one thread; loopback",
        "",
        "| server   | operation       |    ops/s | mean ms | median ms | UPDATEs |",
        "|----------|-----------------|----------|---------|-----------|---------|",
    ]
    for name in args.backends.split(","):
        with scratch(SERVERS[name]) as url:
            upgrade(url)
            times = measure(url, args.n, args.keyed, named=not args.unnamed)
        update_mean = statistics.fmean(times["UPDATE"])
        for op, xs in times.items():
            lines.append(row(name, op, xs, update_mean))
        print(f"{name}: done", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
