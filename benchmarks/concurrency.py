"""What a concurrency key costs a start, against the same start without one.

    python benchmarks/concurrency.py [--n 400] [--backends sqlite,postgres,mariadb]

For each database (a scratch database, migrated, dropped afterwards; SQLite a
temporary file) it times ``start()`` of a one-step workflow from this process,
the store's share only (no broker: an inline dispatcher keeps the messages),
four ways interleaved one of each per round, so a slow minute of this shared
machine weighs on all alike:

- ``plain``: no concurrency key (the baseline: the run and its first pass);
- ``new key``: ``Concurrency(key=..., limit=1)``, a key never seen before per
  start, so each is admitted (the run created queued, its key's row made,
  its entry, then its first pass): a customer's first run;
- ``free key``: one key whose runs have all ended (the slot left, untimed,
  after each start), so each is admitted on a key row that exists: the
  usual case;
- ``key, queued``: one key for every start, so each waits (the run created
  queued and its entry; no pass).

Each keyed start's ratio is taken against the plain start of its own round;
the table shows the median ratio and its quartiles. Server URLs:
``PIKKU_TEST_PG_URL`` / ``PIKKU_TEST_MYSQL_URL`` (admin URLs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pikku_celery import Concurrency, Context
from pikku_celery.engine import RunHandle
from pikku_celery.ports.store import StoreCapabilities
from pikku_celery.sql.engines import make_engine
from pikku_celery.store.migrate import upgrade
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher
from pikku_celery.testing import make_engine as make_workflow_engine

SERVERS = {
    "postgres": os.environ.get(
        "PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get("PIKKU_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
WAYS = ("plain", "new key", "free key", "key, queued")


@contextmanager
def scratch(backend: str) -> Iterator[str]:
    """A fresh database's URL: a temporary SQLite file, or a scratch server database."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory() as d:
            yield f"sqlite:///{d}/bench.db"
        return
    name = f"pikku_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(SERVERS[backend], isolation_level="AUTOCOMMIT")
    url = sa.make_url(SERVERS[backend]).set(database=name)
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


class Dropping(InlineDispatcher):
    """Keeps no messages: the benchmark times the starts, never runs them."""

    def send_step(self, step: Any, countdown: float = 0.0) -> None:
        return None

    def wake_run(self, run_id: str, countdown: float = 0.0, reason: str = "") -> None:
        return None


def measure(url: str, n: int, warmup: int) -> dict[str, list[float]]:
    """Per round one start of each way; seconds per start."""
    if not url.startswith("sqlite"):
        upgrade(url)
    sql = make_engine(url)
    store = store_for(sql)
    engine, dispatcher = make_workflow_engine(store, Dropping())
    dispatcher.task(name="bench.noop")(lambda: None)

    def body(ctx: Context, data: dict[str, Any]) -> Any:
        return ctx.step("noop", "bench.noop")

    plain = engine.workflow(body, name="bench.plain")
    keyed = engine.workflow(
        body, name="bench.keyed", concurrency=Concurrency(key=lambda d: d["key"], limit=1)
    )
    keyed.start({"key": "shared"})  # holds the shared key: the queued starts wait behind it
    slots = StoreCapabilities(store).slots
    assert slots is not None
    ops: dict[str, Callable[[int], RunHandle[Any]]] = {
        "plain": lambda i: plain.start({"key": i}),
        "new key": lambda i: keyed.start({"key": f"own-{i}"}),
        "free key": lambda i: keyed.start({"key": "free"}),
        "key, queued": lambda i: keyed.start({"key": "shared"}),
    }
    times: dict[str, list[float]] = {w: [] for w in WAYS}
    for i in range(n + warmup):
        for way in WAYS:
            t0 = time.perf_counter()
            run = ops[way](i)
            if i >= warmup:
                times[way].append(time.perf_counter() - t0)
            if way == "free key":
                slots.leave_slot(run.run_id)  # as its run's end would
    store.close()
    return times


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return q1, q2, q3


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=400, help="rounds (one start of each way)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--backends", default="sqlite,postgres,mariadb")
    args = parser.parse_args()
    lines = [
        f"n = {args.n} rounds, the four starts interleaved; one thread; loopback",
        "",
        "| database | start          | median ms | ratio to plain (q1 / median / q3) |",
        "|----------|----------------|-----------|-----------------------------------|",
    ]
    for backend in args.backends.split(","):
        with scratch(backend) as url:
            times = measure(url, args.n, args.warmup)
        for way in WAYS:
            ratios = [t / p for t, p in zip(times[way], times["plain"], strict=True)]
            q1, q2, q3 = quartiles(ratios)
            lines.append(
                f"| {backend:<8} | {way:<14} | {statistics.median(times[way]) * 1e3:>9.3f} | "
                f"{q1:>10.2f} / {q2:.2f} / {q3:.2f}{'':>13} |"
            )
        print(f"{backend}: done", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
