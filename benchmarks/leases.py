"""Lease throughput beside the cheapest write each server can do.

    python benchmarks/leases.py [--n 2000] [--rounds 3]

For PostgreSQL, MariaDB and Redis: acquire+release pairs per second through
the lease service on one connection, and a raw single-statement write on the
same server in the same run (PostgreSQL and MariaDB: an autocommit ``UPDATE``
of one row through the bare driver; Redis: ``SET``), with the ratio of the
two. A pair is two round trips and the raw write one, so 0.5 means each lease
operation costs what the bare write does. Raw and lease rounds alternate; the
table shows each one's best round and their ratio, and the median of the
per-round ratios (each lease round over the raw round just before it), which
a busy machine moves less.

Scratch databases and the Redis namespace are created here and dropped at the
end. Server URLs: ``PIKKU_BENCH_PG_URL``, ``PIKKU_BENCH_MYSQL_URL``,
``PIKKU_BENCH_REDIS_URL`` (admin URLs; defaults are the local services).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy as sa

from pikku_celery.lease import LeaseService, RedisLeaseService, SQLLeaseService

PG_URL = os.environ.get(
    "PIKKU_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
MYSQL_URL = os.environ.get("PIKKU_BENCH_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/mysql")
REDIS_URL = os.environ.get("PIKKU_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
TAG = f"pikku_bench_{uuid.uuid4().hex[:8]}"


@dataclass
class Row:
    server: str
    mode: str
    raw_name: str
    raw_rates: list[float]
    pair_rates: list[float]

    @property
    def raw_per_s(self) -> float:
        return max(self.raw_rates)

    @property
    def pairs_per_s(self) -> float:
        return max(self.pair_rates)

    @property
    def ratio(self) -> float:
        return self.pairs_per_s / self.raw_per_s

    @property
    def median_ratio(self) -> float:
        per_round = zip(self.raw_rates, self.pair_rates, strict=True)
        return statistics.median(pair / raw for raw, pair in per_round)


def progress(msg: str) -> None:
    """One status line, rewritten in place on a terminal."""
    if sys.stderr.isatty():
        print(f"\r\033[K{msg}", end="", file=sys.stderr, flush=True)
    elif msg:
        print(msg, file=sys.stderr, flush=True)


def rate(fn: Callable[[], object], n: int) -> float:
    """Calls per second of ``fn`` over ``n`` calls."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def rounds_of(
    rounds: int, n: int, name: str, raw: Callable[[], object], pair: Callable[[], object]
) -> tuple[list[float], list[float]]:
    """Alternate raw and lease rounds (so drift hits both); each one's rate per round."""
    rate(raw, n // 10 + 1)
    rate(pair, n // 10 + 1)
    raws, pairs = [], []
    for i in range(rounds):
        progress(f"{name}: round {i + 1}/{rounds}: raw write")
        raws.append(rate(raw, n))
        progress(f"{name}: round {i + 1}/{rounds}: acquire+release")
        pairs.append(rate(pair, n))
    return raws, pairs


def lease_pair(svc: LeaseService, key: str) -> Callable[[], object]:
    def pair() -> None:
        lease = svc.acquire(key, "bench", 30.0)
        assert lease is not None
        svc.release(lease)

    return pair


@contextmanager
def scratch_database(admin_url: str) -> Iterator[sa.engine.URL]:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {TAG}")
    try:
        yield sa.engine.make_url(admin_url).set(database=TAG)
    finally:
        with admin.connect() as conn:
            if admin.dialect.name == "postgresql":
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE datname = '{TAG}' AND pid <> pg_backend_pid()"
                )
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {TAG}")
        admin.dispose()


def bench_sql(name: str, admin_url: str, n: int, rounds: int) -> list[Row]:
    rows = []
    with scratch_database(admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=0)
        SQLLeaseService(engine).create_schema()
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE bench_row (id INTEGER PRIMARY KEY, v BIGINT)")
            conn.exec_driver_sql("INSERT INTO bench_row VALUES (1, 0)")

        # The raw write: the bare driver on its own connection, autocommit.
        raw_engine = sa.create_engine(url, poolclass=sa.NullPool)
        raw_conn = raw_engine.raw_connection()
        driver: Any = raw_conn.driver_connection
        if engine.dialect.name == "postgresql":
            driver.autocommit = True
        else:
            driver.autocommit(True)
        cur = raw_conn.cursor()

        def raw() -> None:
            cur.execute("UPDATE bench_row SET v = v + 1 WHERE id = 1")

        try:
            # The service bound to one connection it keeps...
            with engine.connect() as conn:
                svc = SQLLeaseService(conn)
                raws, pairs = rounds_of(rounds, n, name, raw, lease_pair(svc, "bench"))
                rows.append(Row(name, "connection", "UPDATE", raws, pairs))
            # ...and on an engine (a pool of one): a checkout per operation.
            svc = SQLLeaseService(engine)
            raws, pairs = rounds_of(rounds, n, name, raw, lease_pair(svc, "bench"))
            rows.append(Row(name, "engine", "UPDATE", raws, pairs))
        finally:
            cur.close()
            raw_conn.close()
            raw_engine.dispose()
            engine.dispose()
    return rows


def bench_redis(n: int, rounds: int) -> Row:
    client = redis.Redis.from_url(REDIS_URL)
    svc = RedisLeaseService(client, namespace=TAG)
    raw_key = f"{{{TAG}}}:raw"
    try:
        raws, pairs = rounds_of(
            rounds, n, "Redis", lambda: client.set(raw_key, b"x"), lease_pair(svc, "bench")
        )
    finally:
        svc.close()
        for key in client.scan_iter(match=f"{{{TAG}}}:*"):
            client.delete(key)
        client.close()
    return Row("Redis", "client", "SET", raws, pairs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="calls per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each (default 3)")
    args = parser.parse_args()

    rows = [
        *bench_sql("PostgreSQL", PG_URL, args.n, args.rounds),
        *bench_sql("MariaDB", MYSQL_URL, args.n, args.rounds),
        bench_redis(args.n, args.rounds),
    ]
    progress("")
    print(f"acquire+release pairs vs one raw write; best of {args.rounds} rounds of {args.n}")
    print()
    print(
        "| server     | service on | raw write | raw/s | raw µs | pairs/s | pair µs | ratio "
        "| median ratio |"
    )
    print(
        "|------------|------------|-----------|-------|--------|---------|---------|-------"
        "|--------------|"
    )
    for r in rows:
        print(
            f"| {r.server:<10} | {r.mode:<10} | {r.raw_name:<9} | {r.raw_per_s:>5.0f} "
            f"| {1e6 / r.raw_per_s:>6.0f} | {r.pairs_per_s:>7.0f} | {1e6 / r.pairs_per_s:>7.0f} "
            f"| {r.ratio:>5.2f} | {r.median_ratio:>12.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
