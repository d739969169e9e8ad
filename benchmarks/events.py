"""Progress events: a workflow that sets an event after every step against the
same workflow without events, same worker, same broker, same run.

    python benchmarks/events.py [--database postgres|mariadb|sqlite] [--steps 20]
                                [--runs 15] [--readers 0]

On one ``celery worker --pool solo`` (Redis broker, a scratch database), each
round runs a Celery chain of N links, the N-step workflow, and the same
workflow with ``ctx.set_event`` after each step (eager steps, the default), in
turn. An event is a value step written in the same transaction as the step
beside it, so it adds rows to that write, not commits. ``--readers R`` adds R
threads of this process polling ``RunHandle.events()`` of the run in flight
as a page would, pausing ``--interval`` seconds between reads (default 0.05,
``get_event``'s longest pause; 0: as fast as it can), to show what readers
cost the writer.

The machines change speed from minute to minute, so each measurement is
paired with the one run just before it; compare the ratios and their spread,
not milliseconds, between runs.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
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
ROWS = ["Celery chain", "workflow", "workflow + an event a step", "reads of events()"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--database", choices=[*sorted(ADMIN_URLS), "sqlite"], default="postgres")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--readers", type=int, default=0, help="threads polling events()")
    p.add_argument(
        "--interval", type=float, default=0.05, help="each reader's pause between reads (s)"
    )
    args = p.parse_args()

    tag = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin: sa.Engine | None = None
    if args.database == "sqlite":
        db_url = f"sqlite:////tmp/{tag}.db"
    else:
        admin_url = ADMIN_URLS[args.database]
        admin = sa.create_engine(
            admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
        )
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {tag}")
        url = sa.engine.make_url(admin_url).set(database=tag)
        db_url = url.render_as_string(hide_password=False)
    env = {**os.environ, "PIKKU_BENCH_BROKER": REDIS, "PIKKU_BENCH_DB": db_url}
    env["PIKKU_BENCH_QUEUE"] = tag
    os.environ.update(env)
    from pikku_celery.store import migrate

    migrate.upgrade(db_url)
    sys.path.insert(0, str(ROOT))
    from benchmarks import eventsapp

    log = open(f"/tmp/{tag}-worker.log", "wb")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchmarks.eventsapp", "worker", "--pool", "solo",
         "-Q", tag, "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    times: dict[str, list[float]] = {k: [] for k in ROWS}
    reads: list[float] = []
    try:
        probes = _probes(eventsapp, args.steps, args.readers, args.interval, reads)
        print(f"warming up ({args.steps} steps, {args.runs} rounds) ...", file=sys.stderr)
        for probe in probes.values():
            probe()
        reads.clear()
        for i in range(args.runs):
            for name, probe in probes.items():
                t0 = time.perf_counter()
                probe()
                times[name].append(time.perf_counter() - t0)
            print(f"\r  {i + 1}/{args.runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
        last = eventsapp.progress.start(args.steps)
        last.wait(timeout=60)
        dispatch = [a.dispatch for h in last.steps() for a in h.attempts]
        print(f"a run with events: steps' dispatch {dict(Counter(dispatch))}", file=sys.stderr)
        for _ in range(args.runs):
            t0 = time.perf_counter()
            assert len(last.events()) == args.steps
            times["reads of events()"].append(time.perf_counter() - t0)
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        worker.wait(60)
        log.close()
        assert eventsapp.pikku.sql_engine is not None
        eventsapp.pikku.store.close()  # its settle listener, before the database goes
        eventsapp.pikku.sql_engine.dispose()
        if admin is not None:
            with admin.connect() as conn:
                force = " WITH (FORCE)" if args.database == "postgres" else ""
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag}{force}")
        else:
            Path(f"/tmp/{tag}.db").unlink(missing_ok=True)
    _report(args, times, reads)
    return 0


def _probes(app: Any, n: int, readers: int, interval: float, reads: list[float]) -> dict[str, Any]:
    from celery import chain

    def celery_chain() -> None:
        links = chain(app.inc.s(0), *[app.inc.s() for _ in range(n - 1)])
        assert links.apply_async().get(timeout=60) == n

    def plain() -> None:
        assert app.plain.start(n).wait(timeout=60) == n

    def with_events() -> None:
        run = app.progress.start(n)
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                t0 = time.perf_counter()
                run.events()
                reads.append(time.perf_counter() - t0)
                done.wait(interval)

        threads = [threading.Thread(target=read) for _ in range(readers)]
        for t in threads:
            t.start()
        try:
            assert run.wait(timeout=60) == n
        finally:
            done.set()
            for t in threads:
                t.join()
        assert [e.value["done"] for e in run.events()] == list(range(1, n + 1))

    return {
        "Celery chain": celery_chain,
        "workflow": plain,
        "workflow + an event a step": with_events,
    }


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[1], q[2]


def _report(args: argparse.Namespace, times: dict[str, list[float]], reads: list[float]) -> None:
    n = args.steps
    print(
        f"\n{n}-step runs, median of {args.runs} rounds, Redis broker, {args.database} store, "
        f"--pool solo, {args.readers} reader thread(s) polling events() every "
        f"{args.interval} s\n"
    )
    print(f"| {'what':<28} | {'total ms':>9} | {'per step ms':>11} | {'paired ratio':>34} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 13}|{'-' * 36}|")
    against = {"workflow": "Celery chain", "workflow + an event a step": "workflow"}
    for name in ROWS:
        total = statistics.median(times[name]) * 1000
        per = "" if name == "reads of events()" else f"{total / n:.2f}"
        ratio = ""
        if name in against:
            pairs = zip(times[name], times[against[name]], strict=True)
            q1, q2, q3 = _quartiles([a / b for a, b in pairs])
            versus = "chain" if name == "workflow" else "workflow"
            ratio = f"{q2:.2f}x ({q1:.2f} to {q3:.2f}) vs {versus}"
        print(f"| {name:<28} | {total:>9.2f} | {per:>11} | {ratio:>34} |")
    print(
        f"\nreads of events(): one reader's read of a finished {n}-step run with {n} events "
        "(its event steps alone: WorkflowStore.event_steps)"
    )
    if reads:
        q1, q2, q3 = _quartiles(reads)
        print(
            f"reader threads: {len(reads)} reads while runs ran, median {q2 * 1000:.2f} ms "
            f"({q1 * 1000:.2f} to {q3 * 1000:.2f})"
        )


if __name__ == "__main__":
    sys.exit(main())
