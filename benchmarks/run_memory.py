"""What one long run costs a worker in memory: RSS before, at its peak and after.

    python benchmarks/run_memory.py [--steps 10000] [--mode eager|broker]

An in-process Celery worker (``--pool solo`` in a thread, in-memory broker)
on a scratch PostgreSQL database (``PIKKU_TEST_PG_URL`` as the admin URL)
runs a 200-step warm-up, then one run of ``--steps`` sequential steps. A
thread samples the process's RSS every 50 ms. Printed: RSS before the run,
its peak while the run went, and after it ended, with the growth of each.
The parked body, its recorded steps and the engine's kept views are what a
long run holds; they are bounded by ``resume_max_steps`` and the known-runs
cache, so the growth must not follow the run's length.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from typing import Any

import psutil
import sqlalchemy as sa
from celery import Celery
from celery.contrib.testing.worker import start_worker

from pikku_celery import Context, Pikku

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
MB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--mode", choices=["eager", "broker"], default="eager")
    args = parser.parse_args()
    from pikku_celery.store import migrate

    tag = f"pikku_memory_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    url = sa.engine.make_url(PG_ADMIN).set(database=tag).render_as_string(hide_password=False)
    try:
        migrate.upgrade(url)
        print(measure(url, args.steps, args.mode))
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")


def measure(url: str, steps: int, mode: str) -> str:
    app = Celery("memory", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_default_queue="pikku-memory")
    pikku = Pikku(app, url, install_beat=False, max_steps_per_run=max(steps, 1000))

    @app.task(name="memory.inc", shared=False)
    def inc(x: int) -> int:
        return x + 1

    @pikku.workflow(name="memory.linear", eager_steps=mode == "eager")
    def linear(ctx: Context, n: int) -> Any:
        x = 0
        for i in range(n):
            x = ctx.step(f"s{i}", inc, x)
        return x

    proc = psutil.Process()
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING") as w:
            assert linear.start(200).wait(timeout=120) == 200
            before = proc.memory_info().rss
            peak[0] = before
            assert linear.start(steps).wait(timeout=3600) == steps
            after = proc.memory_info().rss
            app.control.shutdown(destination=[w.hostname])
    finally:
        stop.set()
        pikku.close()
    return (
        f"{mode}, one {steps}-step run: RSS before {before / MB:.1f} MB, "
        f"peak {peak[0] / MB:.1f} MB (+{(peak[0] - before) / MB:.1f}), "
        f"after {after / MB:.1f} MB (+{(after - before) / MB:.1f})"
    )


if __name__ == "__main__":
    main()
