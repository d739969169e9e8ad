"""A durable workflow against the plain Celery chain it replaces, same broker, same run.

    python benchmarks/workflow.py [--steps 10] [--runs 30] [--concurrent 50] [--rounds 3]

Latency: one `celery worker --pool solo` on a Redis broker and a scratch
PostgreSQL database; interleaved, a chain of N `inc` links (waiting on its
result in the Redis backend) and an N-step pikku workflow of the same task
(waiting with RunHandle.wait). Throughput: a `--pool prefork -c 2` worker;
C concurrent N-step workflows against C concurrent N-link chains, in
alternating rounds. Prints the medians, steps/s and the ratios.

The machines this runs on change speed from minute to minute, so each
workflow is paired with the chain run just before it: the ratio of each pair
is immune to a slow minute that hits both, and their quartiles show the
spread. Compare ratios, not milliseconds, between runs of this script.
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
    p.add_argument("--concurrent", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3, help="throughput rounds of each")
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

    def start_worker(*pool: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "benchmarks.benchapp", "worker", *pool,
             "-Q", tag, "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel", "WARNING"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def stop_worker(w: subprocess.Popen[bytes]) -> None:
        os.killpg(w.pid, signal.SIGTERM)
        w.wait(30)

    worker = start_worker("--pool", "solo")
    through: dict[str, list[float]] = {"chain": [], "workflow": []}
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
        stop_worker(worker)
        worker = start_worker("--pool", "prefork", "-c", "2")
        print(f"throughput: {args.concurrent} concurrent runs, prefork -c 2 ...", file=sys.stderr)
        chain(inc.s(0), inc.s()).apply_async().get(timeout=60)  # the pool is up
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            results = [
                chain(inc.s(0), *[inc.s() for _ in range(args.steps - 1)]).apply_async()
                for _ in range(args.concurrent)
            ]
            assert all(r.get(timeout=120) == args.steps for r in results)
            through["chain"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            handles = [benchapp.linear.start(args.steps) for _ in range(args.concurrent)]
            assert all(h.wait(timeout=120) == args.steps for h in handles)
            through["workflow"].append(time.perf_counter() - t0)
            print(f"\r  round {len(through['chain'])}/{args.rounds}", end="", file=sys.stderr)
        print(file=sys.stderr)
    finally:
        stop_worker(worker)
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
    q1, q2, q3 = quartiles([w / k for w, k in zip(flows, chains, strict=True)])
    print(f"\ndurable step adds {(f - c) * 1000 / n:+.2f} ms per step ({f / c:.2f}x the chain)")
    print(f"paired ratio: median {q2:.2f}x the chain (quartiles {q1:.2f} to {q3:.2f})")
    steps = args.concurrent * n
    tc, tw = statistics.median(through["chain"]), statistics.median(through["workflow"])
    print(f"\n{args.concurrent} concurrent {n}-step runs, prefork -c 2, median of {args.rounds}\n")
    print(f"| {'what':<28} | {'wall s':>7} | {'steps/s':>8} |")
    print(f"|{'-' * 30}|{'-' * 9}|{'-' * 10}|")
    print(f"| {'Celery chains':<28} | {tc:>7.2f} | {steps / tc:>8.0f} |")
    print(f"| {'pikku workflows':<28} | {tw:>7.2f} | {steps / tw:>8.0f} |")
    rounds = ", ".join(
        f"{w / k:.2f}" for w, k in zip(through["workflow"], through["chain"], strict=True)
    )
    print(f"\nworkflow time {tw / tc:.2f}x the chains' (each round: {rounds})")
    return 0


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[1], q[2]


if __name__ == "__main__":
    sys.exit(main())
