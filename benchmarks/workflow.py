"""A durable workflow against the plain Celery chain it replaces, same broker, same run.

    python benchmarks/workflow.py [--steps 10] [--runs 30]

Starts one `celery worker --pool solo` on a Redis broker and a scratch
PostgreSQL database, then times, interleaved, a chain of N `inc` links
(waiting on its result in the Redis backend) and an N-step pikku workflow
of the same task (waiting with RunHandle.wait). Prints medians and the cost
a durable step adds to a chain link.
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
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--runs", type=int, default=30)
    args = p.parse_args()

    tag = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    db_url = sa.engine.make_url(PG_ADMIN).set(database=tag).render_as_string(hide_password=False)
    env = {
        **os.environ,
        "PIKKU_BENCH_BROKER": REDIS,
        "PIKKU_BENCH_DB": db_url,
        "PIKKU_BENCH_QUEUE": tag,
    }
    os.environ.update(env)
    from pikku_celery.store import migrate

    migrate.upgrade(db_url)
    sys.path.insert(0, str(ROOT))
    from benchmarks import benchapp

    log = open(f"/tmp/{tag}-worker.log", "wb")  # noqa: SIM115 - lives as long as the worker
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker", "--pool", "solo",
         "-Q", tag, "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel", "WARNING"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        from celery import chain

        inc = benchapp.inc
        print(f"warming up ({args.steps} steps, {args.runs} runs each) ...", file=sys.stderr)
        chain(inc.s(0), *[inc.s() for _ in range(args.steps - 1)]).apply_async().get(timeout=60)
        benchapp.linear.start(args.steps).wait(timeout=60)
        chains: list[float] = []
        flows: list[float] = []
        for i in range(args.runs):
            t0 = time.perf_counter()
            result = chain(inc.s(0), *[inc.s() for _ in range(args.steps - 1)]).apply_async()
            assert result.get(timeout=60) == args.steps
            chains.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            assert benchapp.linear.start(args.steps).wait(timeout=60) == args.steps
            flows.append(time.perf_counter() - t0)
            print(f"\r  {i + 1}/{args.runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(20)
        log.close()
        benchapp.pikku.sql_engine.dispose()  # type: ignore[union-attr]
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")

    n = args.steps
    c, f = statistics.median(chains), statistics.median(flows)
    print(f"\n{n}-step run, median of {args.runs}, Redis broker, PostgreSQL store, --pool solo\n")
    print(f"| {'what':<28} | {'total ms':>9} | {'per step ms':>11} |")
    print(f"|{'-' * 30}|{'-' * 11}|{'-' * 13}|")
    print(f"| {'Celery chain (Redis backend)':<28} | {c * 1000:>9.2f} | {c * 1000 / n:>11.2f} |")
    print(f"| {'pikku workflow':<28} | {f * 1000:>9.2f} | {f * 1000 / n:>11.2f} |")
    print(f"\ndurable step adds {(f - c) * 1000 / n:+.2f} ms per step ({f / c:.2f}x the chain)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
