"""A durable workflow against the plain Celery it replaces, same broker, same worker, same run.

    python benchmarks/workflow.py [--database postgres|mariadb] [--steps 20] [--runs 15]
                                  [--concurrent 200] [--concurrent-steps 5] [--rounds 3]
                                  [--skip-throughput] [--skip-chain]

A long run (``--steps 10000 --runs 2 --skip-chain --skip-throughput``) shows
how a step's cost grows with the run's history; the chain, which carries its
remaining links in every message, is left out there. Past 20 steps each
round also runs both workflows at 20 steps, and the report gives each
one's per-step cost at N over its cost at 20, paired by round.

Latency, on one `celery worker --pool solo` (Redis broker, a scratch
database): in each round, a chain of N `inc` links (its result read from the
Redis backend), an N-step workflow of the same task with eager steps (the
default), the same workflow with ``eager_steps=False`` (every step a broker
message), one plain task's ``apply_async().get()`` and a 1-step workflow's
``start().wait()``. Beside them, the store's own share, timed from this
process on the same database: the claim and the pass a broker step makes,
and the start, claim and ending pass of a 1-step run, with no broker and no
worker; a row's paired ratio is what those statements alone cost against
the Celery baseline, the floor under the workflow row above it. Then what a
step costs the database: on PostgreSQL the write transactions of one eager
run, counted in the write-ahead log (pg_walinspect); on MariaDB the round
trips the worker made per step.
Throughput, on a ``--pool prefork -c 2`` worker: C concurrent M-step
workflows (steps/s) against C plain tasks (tasks/s), in alternating rounds.

The machines this runs on change speed from minute to minute, so each
measurement is paired with the chain (or plain task) run just before it: the
ratio of each pair is immune to a slow minute that hits both, and the
quartiles show the spread. Compare ratios, not milliseconds, between runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
ADMIN_URLS = {
    "postgres": os.environ.get(
        "PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get("PIKKU_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
REDIS = os.environ.get("PIKKU_BENCH_REDIS", "redis://127.0.0.1:6379/12")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--database", choices=sorted(ADMIN_URLS), default="postgres")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--runs", type=int, default=15, help="latency rounds")
    p.add_argument("--concurrent", type=int, default=200)
    p.add_argument("--concurrent-steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds of each")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-chain", action="store_true", help="no Celery chain row (long runs)")
    args = p.parse_args()

    tag = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin_url = ADMIN_URLS[args.database]
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    db_url = sa.engine.make_url(admin_url).set(database=tag).render_as_string(hide_password=False)
    count_file = Path(tempfile.gettempdir()) / f"{tag}.round_trips"
    env = {
        **os.environ,
        "PIKKU_BENCH_BROKER": REDIS,
        "PIKKU_BENCH_DB": db_url,
        "PIKKU_BENCH_QUEUE": tag,
        "PIKKU_BENCH_MAX_STEPS": str(max(1000, args.steps)),
    }
    os.environ.update(env)
    from pikku_celery.store import migrate

    migrate.upgrade(db_url)
    sys.path.insert(0, str(ROOT))
    from benchmarks import benchapp

    log = open(f"/tmp/{tag}-worker.log", "wb")  # noqa: SIM115 - lives as long as the workers

    def start_worker(*pool: str, count: bool = False) -> subprocess.Popen[bytes]:
        extra = {"PIKKU_BENCH_COUNT": str(count_file)} if count else {}
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker", *pool,
             "-Q", tag, "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING"],
            cwd=ROOT, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def stop_worker(w: subprocess.Popen[bytes]) -> None:
        os.kill(w.pid, signal.SIGTERM)  # warm: the worker writes its counts
        w.wait(60)

    n = args.steps
    times: dict[str, list[float]] = {k: [] for k in LATENCY}
    through: dict[str, list[float]] = {"plain tasks": [], "workflows": []}
    cost = ""
    store_engine: sa.Engine | None = None
    worker = start_worker("--pool", "solo")
    try:
        probes = latency_probes(benchapp, n)
        floor, store_engine = store_probes(db_url, n)
        probes.update(floor)
        if args.skip_chain:
            del probes["Celery chain"]
            times.pop("Celery chain")
        growth = n > REFERENCE
        if growth:
            probes.update(reference_probes(benchapp))
            times.update({name: [] for name in REFERENCE_ROWS.values()})
        print(f"warming up ({n} steps, {args.runs} rounds) ...", file=sys.stderr)
        for name, probe in probes.items():
            if n <= LONGEST_WARMED or name not in LONG_PROBES:
                probe()  # a run of thousands of steps is its own warm-up
        long = [name for name in LATENCY if name in LONG_PROBES and name in probes]
        long += list(REFERENCE_ROWS.values()) if growth else []
        short = [name for name in LATENCY if name not in LONG_PROBES]
        for i in range(args.runs):
            # A 1-step run is short: ten pairs per round, each pair in turn.
            for names in [long] + [short] * SHORT_REPEATS:
                for name in names:
                    t0 = time.perf_counter()
                    probes[name]()
                    times[name].append(time.perf_counter() - t0)
            print(f"\r  {i + 1}/{args.runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
        if args.database == "postgres" and n <= LONGEST_WARMED:
            # (past it, the segments the count reads are recycled before it reads them)
            try:
                cost = wal_cost(admin, tag, lambda: probes["workflow, eager steps"](), n)
            except sa.exc.OperationalError as exc:  # a busy shared server recycled the WAL
                cost = f"PostgreSQL: no WAL count ({str(exc).splitlines()[0]})"
        stop_worker(worker)
        if args.database == "mariadb":
            counted = {}
            for name in ("workflow, eager steps", "workflow, eager_steps=False"):
                worker = start_worker("--pool", "solo", count=True)
                probes[name]()  # the worker is up (and its counter was reset at ready)
                stop_worker(worker)
                first = int(count_file.read_text())
                worker = start_worker("--pool", "solo", count=True)
                for _ in range(COUNTED_RUNS + 1):
                    probes[name]()
                stop_worker(worker)
                counted[name] = (int(count_file.read_text()) - first) / (COUNTED_RUNS * n)
            per_step = ", ".join(f"{k}: {v:.1f}" for k, v in counted.items())
            cost = f"MariaDB, the worker's round trips per step (claims, run ends in): {per_step}"
        if not args.skip_throughput:
            worker = start_worker("--pool", "prefork", "-c", "2")
            m, c = args.concurrent_steps, args.concurrent
            print(f"throughput: {c} concurrent {m}-step runs, prefork -c 2 ...", file=sys.stderr)
            benchapp.inc.delay(0).get(timeout=60)  # the pool is up
            benchapp.linear.start(m).wait(timeout=60)
            for r in range(args.rounds):
                t0 = time.perf_counter()
                results = [benchapp.inc.delay(i) for i in range(c)]
                assert [x.get(timeout=120) for x in results] == [i + 1 for i in range(c)]
                through["plain tasks"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                handles = [benchapp.linear.start(m) for _ in range(c)]
                assert all(h.wait(timeout=300) == m for h in handles)
                through["workflows"].append(time.perf_counter() - t0)
                print(f"\r  round {r + 1}/{args.rounds}", end="", file=sys.stderr)
            print(file=sys.stderr)
    finally:
        if worker.poll() is None:
            stop_worker(worker)
        log.close()
        benchapp.pikku.close()  # its pools and its settle listener, before the drop
        if store_engine is not None:
            store_engine.dispose()
        count_file.unlink(missing_ok=True)
        with admin.connect() as conn:
            if args.database == "postgres":
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag}")

    report(args, times, through, cost)
    return 0


COUNTED_RUNS = 5
LONGEST_WARMED = 1000
SHORT_REPEATS = 10
CLAIM_AND_PASS = "store: claim + pass"
START_CLAIM_END = "store: start, claim, end"
LONG_PROBES = {
    "Celery chain",
    "workflow, eager steps",
    "workflow, eager_steps=False",
    CLAIM_AND_PASS,
}

LATENCY = [
    "Celery chain",
    "workflow, eager steps",
    "workflow, eager_steps=False",
    CLAIM_AND_PASS,
    "plain task",
    "1-step workflow",
    START_CLAIM_END,
]


REFERENCE = 20
REFERENCE_ROWS = {
    "workflow, eager steps": f"eager steps, {REFERENCE}-step run",
    "workflow, eager_steps=False": f"eager_steps=False, {REFERENCE}-step run",
}


def reference_probes(benchapp: Any) -> dict[str, Callable[[], None]]:
    """Both workflows at 20 steps, timed in the same rounds as the long ones."""

    def eager() -> None:
        assert benchapp.linear.start(REFERENCE).wait(timeout=60) == REFERENCE

    def broker() -> None:
        assert benchapp.linear_broker.start(REFERENCE).wait(timeout=60) == REFERENCE

    eager_row, broker_row = REFERENCE_ROWS.values()
    return {eager_row: eager, broker_row: broker}


def latency_probes(benchapp: Any, n: int) -> dict[str, Callable[[], None]]:
    """Each measured thing, as a call that runs it once and checks its result."""
    from celery import chain

    inc = benchapp.inc
    timeout = 60 + n / 10  # a long run on a loaded machine

    def celery_chain() -> None:
        links = chain(inc.s(0), *[inc.s() for _ in range(n - 1)])
        assert links.apply_async().get(timeout=timeout) == n

    def eager() -> None:
        assert benchapp.linear.start(n).wait(timeout=timeout) == n

    def broker() -> None:
        assert benchapp.linear_broker.start(n).wait(timeout=timeout) == n

    def plain() -> None:
        assert inc.apply_async((0,)).get(timeout=60) == 1

    def one_step() -> None:
        assert benchapp.linear.start(1).wait(timeout=60) == 1

    return {
        "Celery chain": celery_chain,
        "workflow, eager steps": eager,
        "workflow, eager_steps=False": broker,
        "plain task": plain,
        "1-step workflow": one_step,
    }


def store_probes(db_url: str, n: int) -> tuple[dict[str, Callable[[], None]], sa.Engine]:
    """The statements a workflow cannot do without, on the store alone: per
    broker step a claim and a pass (``n`` of them, as the chain has ``n``
    links), and for a 1-step run its start, its claim and the pass that ends
    it. Timed beside the Celery rows, they are the floor under the workflow
    rows: no broker, no worker, no Celery."""
    from benchmarks.store import TASK, claim_advance_op
    from pikku_celery.engine.known_runs import KnownRuns
    from pikku_celery.engine.passes import start_pass, take_pass
    from pikku_celery.ports.store import RunStarts
    from pikku_celery.sql.engines import make_engine
    from pikku_celery.store import Decision, NewRun, NewStep, RunStatus, StepKind, StepOutcome
    from pikku_celery.store.sql_for import store_for

    engine = make_engine(db_url)
    store = store_for(engine)
    runs = KnownRuns()  # what the engine threads between the store's calls
    prepare, cycle = claim_advance_op(store)

    def claim_and_pass() -> None:
        for _ in range(n):
            prepare()
            cycle()

    one = Decision(new_steps=[NewStep(name="s0", seq=0, kind=StepKind.TASK, task_name=TASK)])
    end = Decision(run_status=RunStatus.COMPLETED, output=1)

    def start_claim_end() -> None:
        new = NewRun("bench", 0)
        # As the engine's start(): the run with its first pass in one write
        # where the store can.
        starts = store if isinstance(store, RunStarts) else None
        started = start_pass(store, starts, new, lambda _: one, runs)
        first = started.steps[0].id
        got = store.claim(first, TASK, "bench-worker", 60_000, known=runs.take(first))
        assert got is not None
        outcome = StepOutcome(got.step.id, got.step.attempt, ok=True, result=1)
        take_pass(store, new.id, outcome, lambda _: end, got.view, runs)

    return {CLAIM_AND_PASS: claim_and_pass, START_CLAIM_END: start_claim_end}, engine


def wal_cost(admin: sa.Engine, database: str, run: Callable[[], None], n: int) -> str:
    """The write transactions one eager run of ``n`` steps makes on the
    database, counted in the write-ahead log."""
    from tests.wal import database_oid, wal_position, write_transactions

    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        oid = database_oid(conn, database)
        since = wal_position(conn)
        run()
        written = write_transactions(conn, oid, since, wal_position(conn))
    return (
        f"PostgreSQL: one {n}-step eager run wrote {written} transactions "
        f"(start: the run with its first pass; the worker: 1 asynchronous claim, then "
        f"{written - 2} passes for {n} steps)"
    )


def report(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    through: dict[str, list[float]],
    cost: str,
) -> None:
    n = args.steps
    med = {k: statistics.median(v) for k, v in times.items()}
    store = "PostgreSQL" if args.database == "postgres" else "MariaDB"
    print(
        f"\nlatency, median of {args.runs} rounds ({SHORT_REPEATS} pairs of the 1-step rows "
        f"a round), Redis broker, {store} store, --pool solo\n"
    )
    head = f"| {'what':<28} | {'total ms':>9} | {'per step ms':>11} | {'paired ratio':>28} |"
    print(f"{head}  target |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 13}|{'-' * 30}|---------|")
    rows = [
        ("Celery chain", n, None, ""),
        ("workflow, eager steps", n, "Celery chain", "<= 0.6x"),
        ("workflow, eager_steps=False", n, "Celery chain", "<= 1.4x"),
        (CLAIM_AND_PASS, n, "Celery chain", "<= 0.4x"),
        ("plain task", 1, None, ""),
        ("1-step workflow", 1, "plain task", "<= 1.5x"),
        (START_CLAIM_END, 1, "plain task", "<= 0.5x"),
    ]
    for name, steps, against, target in rows:
        if name not in times:
            continue  # --skip-chain
        ratio = ""
        if against is not None and against in times:
            pairs = zip(times[name], times[against], strict=True)
            q1, q2, q3 = quartiles([a / b for a, b in pairs])
            ratio = f"{q2:.2f}x ({q1:.2f} to {q3:.2f})"
        total = med[name] * 1000
        per = total / steps
        print(f"| {name:<28} | {total:>9.2f} | {per:>11.2f} | {ratio:>28} | {target:>7} |")
    print(
        "\nstore rows: the claim and the pass of a broker step, and the start, claim and "
        "ending pass of a 1-step run, on the store alone (no broker, no worker); their "
        "target is what the workflow row's target leaves for everything a workflow adds"
    )
    for long, short in REFERENCE_ROWS.items():
        if short in times:
            pairs = zip(times[long], times[short], strict=True)
            q1, q2, q3 = quartiles([(a / n) / (b / REFERENCE) for a, b in pairs])
            per = med[short] * 1000 / REFERENCE
            print(
                f"\n{long}: per step at {n} steps / per step at {REFERENCE} "
                f"({per:.2f} ms), paired by round: {q2:.2f}x ({q1:.2f} to {q3:.2f})"
            )
    if cost:
        print(f"\n{cost}")
    if not through["workflows"]:
        return
    c, m = args.concurrent, args.concurrent_steps
    tp = statistics.median(through["plain tasks"])
    tw = statistics.median(through["workflows"])
    print(f"\nthroughput, prefork -c 2, median of {args.rounds} rounds\n")
    print(f"| {'what':<40} | {'wall s':>7} | {'per s':>8} |")
    print(f"|{'-' * 42}|{'-' * 9}|{'-' * 10}|")
    print(f"| {f'{c} plain tasks':<40} | {tp:>7.2f} | {c / tp:>8.0f} |")
    flows = f"{c} concurrent {m}-step workflows (steps)"
    print(f"| {flows:<40} | {tw:>7.2f} | {c * m / tw:>8.0f} |")
    rounds = ", ".join(
        f"{(c * m / w) / (c / p):.2f}"
        for w, p in zip(through["workflows"], through["plain tasks"], strict=True)
    )
    ratio = (c * m / tw) / (c / tp)
    print(f"\nsteps/s {ratio:.2f}x plain tasks/s (each round: {rounds}; target >= 1.5x)")


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]  # --runs 1
    q = statistics.quantiles(values, n=4)
    return q[0], q[1], q[2]


if __name__ == "__main__":
    sys.exit(main())
