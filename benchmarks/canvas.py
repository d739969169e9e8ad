"""A durable canvas chain against the same plain Celery chain, same broker, same worker, one run.

    python benchmarks/canvas.py [--links 20] [--runs 20] [--members 1000] [--group-runs 3]

One `celery worker --pool solo` (the workflow benchmark's app) on a Redis
broker and a scratch PostgreSQL database. Interleaved: a plain chain of N
`inc` links (waiting on its result in the Redis backend), the same chain as
``pikku.durable(chain).wait()``, and for reference the N-step workflow of the
same task. Each durable run is paired with the chain run just before it; the
paired ratios' quartiles show the spread (these machines change speed from
minute to minute). Compare ratios, not milliseconds, between runs. Then a
group of ``--members`` ``inc`` tasks, plain (``GroupResult.get()``) and
durable, interleaved: a pass of the durable run costs what changed, not the
group's size (Celery's ``test_large_group`` asks for 1,000).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS = os.environ.get("PIKKU_BENCH_REDIS", "redis://127.0.0.1:6379/12")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--links", type=int, default=20)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--members", type=int, default=1000)
    p.add_argument("--group-runs", type=int, default=3)
    args = p.parse_args()

    tag = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    db_url = sa.engine.make_url(PG_ADMIN).set(database=tag).render_as_string(hide_password=False)
    env = {**os.environ, "PIKKU_BENCH_BROKER": REDIS, "PIKKU_BENCH_DB": db_url}
    env["PIKKU_BENCH_QUEUE"] = tag
    os.environ.update(env)
    from pikku_celery.store import migrate

    migrate.upgrade(db_url)
    sys.path.insert(0, str(ROOT))
    from celery import chain, group

    from benchmarks import benchapp

    log = open(f"/tmp/{tag}-worker.log", "wb")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker", "--pool", "solo",
         "-Q", tag, "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    n = args.links
    inc = benchapp.inc

    def canvas() -> object:
        return chain(inc.s(0), *[inc.s() for _ in range(n - 1)])

    times: dict[str, list[float]] = {"chain": [], "durable": [], "workflow": []}
    m = args.members
    expected = list(range(1, m + 1))

    def members() -> object:
        return group(inc.s(i) for i in range(m))

    group_times: dict[str, list[float]] = {"group": [], "durable group": []}
    try:
        print(f"warming up ({n} links, {args.runs} runs each) ...", file=sys.stderr)
        assert canvas().apply_async().get(timeout=60) == n  # type: ignore[attr-defined]
        assert benchapp.pikku.durable(canvas()).wait(timeout=60) == n
        assert benchapp.linear.start(n).wait(timeout=60) == n
        for i in range(args.runs):
            t0 = time.perf_counter()
            assert canvas().apply_async().get(timeout=60) == n  # type: ignore[attr-defined]
            times["chain"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert benchapp.pikku.durable(canvas()).wait(timeout=60) == n
            times["durable"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert benchapp.linear.start(n).wait(timeout=60) == n
            times["workflow"].append(time.perf_counter() - t0)
            print(f"\r  {i + 1}/{args.runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
        for i in range(args.group_runs):
            t0 = time.perf_counter()
            assert members().apply_async().get(timeout=600) == expected  # type: ignore[attr-defined]
            group_times["group"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert benchapp.pikku.durable(members()).wait(timeout=600) == expected
            group_times["durable group"].append(time.perf_counter() - t0)
            print(f"\r  group {i + 1}/{args.group_runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
        log.close()
        benchapp.pikku.sql_engine.dispose()  # type: ignore[union-attr]
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")

    chain_ms = statistics.median(times["chain"]) * 1000
    print(f"\n{n}-link chain, median of {args.runs}, Redis broker, PostgreSQL store, --pool solo\n")
    print(f"| {'what':<34} | {'total ms':>9} | {'per link ms':>11} | {'x chain':>7} |")
    print(f"|{'-' * 36}|{'-' * 11}|{'-' * 13}|{'-' * 9}|")
    for key, label in (
        ("chain", "Celery chain (Redis backend)"),
        ("durable", "pikku.durable(chain)"),
        ("workflow", "pikku workflow, ctx.step per link"),
    ):
        ms = statistics.median(times[key]) * 1000
        print(f"| {label:<34} | {ms:>9.2f} | {ms / n:>11.2f} | {ms / chain_ms:>7.2f} |")
    paired = [d / c for d, c in zip(times["durable"], times["chain"], strict=True)]
    if len(paired) > 1:
        q = statistics.quantiles(paired, n=4)
        print(f"\ndurable canvas, paired with the chain just before it: median {q[1]:.2f}x")
        print(f"(quartiles {q[0]:.2f} to {q[2]:.2f})")
    if args.group_runs:
        group_ms = statistics.median(group_times["group"]) * 1000
        print(f"\n{m}-member group, median of {args.group_runs}\n")
        print(f"| {'what':<34} | {'total ms':>9} | {'per member ms':>13} | {'x group':>7} |")
        print(f"|{'-' * 36}|{'-' * 11}|{'-' * 15}|{'-' * 9}|")
        for key, label in (
            ("group", "Celery group (Redis backend)"),
            ("durable group", "pikku.durable(group)"),
        ):
            ms = statistics.median(group_times[key]) * 1000
            print(f"| {label:<34} | {ms:>9.2f} | {ms / m:>13.2f} | {ms / group_ms:>7.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
