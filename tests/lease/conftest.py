"""Lease backends for the shared suites: one fresh service per test.

Every backend comes with what the suites need beyond the protocol: a *peer*
(the same store through its own connections, for races between threads) and
``expire`` (force the live lease on a key to lapse, keeping its token), used
by the state-machine test instead of waiting for real time to pass.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import redis
import sqlalchemy as sa

from pikku_celery.lease import (
    TTL,
    InMemoryLeaseService,
    Lease,
    LeaseService,
    RedisLeaseService,
    SQLLeaseService,
)
from pikku_celery.sql.engines import create_sqlite_engine
from tests.pgbouncer import PgBouncer, pooled_engine
from tests.services import REDIS_URL

# The five backends of the contract, plus code paths that would otherwise go
# untested here: the MySQL path (no RETURNING) run on MariaDB and SQLite, and
# the SQL service bound to one connection instead of an engine.
BACKENDS = ["memory", "sqlite", "postgres", "mariadb", "redis"]
EXTRA_PATHS = [
    "mariadb-readback",
    "sqlite-readback",
    "postgres-connection",
    "mariadb-connection",
]
SERVER_CLOCK = ["postgres", "mariadb", "redis"]
POOLED = "postgres-pgbouncer"
"""The PostgreSQL service through PgBouncer in transaction pooling (the
conformance suite's extra backend)."""


def new_key(prefix: str = "k") -> str:
    """A key no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def exercise(svc: LeaseService) -> None:
    """Every operation once on a fresh key, checking the answers."""
    key = new_key()
    lease = svc.acquire(key, "A", 5.0)
    assert lease is not None and lease.token == 1
    assert svc.acquire(key, "B", 5.0) is None
    assert svc.get(key) == lease
    refreshed = svc.refresh(lease, 5.0)
    assert refreshed is not None and refreshed.token == 1
    svc.release(refreshed)
    assert svc.get(key) is None
    assert svc.refresh(lease, 5.0) is None


@dataclass
class Backend:
    """A lease service under test and the tools to poke at its store."""

    name: str
    service: LeaseService
    make_peer: Callable[[], LeaseService]
    expire: Callable[[str], None]
    _cleanups: list[Callable[[], None]] = field(default_factory=list)

    def peer(self) -> LeaseService:
        """The same store through a separate connection (or client)."""
        return self.make_peer()

    def close(self) -> None:
        for fn in reversed(self._cleanups):
            fn()


def _memory() -> Backend:
    svc = InMemoryLeaseService()
    return Backend("memory", svc, lambda: svc, svc.lapse)


def _sql(
    name: str, engine: sa.Engine, url: str, use_returning: bool | None, bound: bool = False
) -> Backend:
    cleanups: list[Callable[[], None]] = []

    def service(on: sa.Engine) -> SQLLeaseService:
        if not bound:
            return SQLLeaseService(on, use_returning=use_returning)
        conn = on.connect()
        cleanups.append(conn.close)
        return SQLLeaseService(conn, use_returning=use_returning)

    svc = service(engine)
    table = svc.table

    def make_peer() -> LeaseService:
        # Servers: the session engine's pool hands each thread (or each bound
        # service) a connection of its own. SQLite: an engine of its own.
        if engine.dialect.name != "sqlite":
            return service(engine)
        peer_engine = create_sqlite_engine(url)
        cleanups.append(peer_engine.dispose)
        return service(peer_engine)

    def expire(key: str) -> None:
        with engine.begin() as conn:
            conn.execute(
                sa.update(table)
                .where(table.c.key == key, table.c.expires_at > 1)
                .values(expires_at=1)
            )

    return Backend(name, svc, make_peer, expire, cleanups)


def _redis(namespace: str) -> Backend:
    client = redis.Redis.from_url(REDIS_URL)
    svc = RedisLeaseService(client, namespace=namespace)
    clients: list[redis.Redis] = [client]

    def make_peer() -> LeaseService:
        peer = redis.Redis.from_url(REDIS_URL)
        clients.append(peer)
        return RedisLeaseService(peer, namespace=namespace)

    def expire(key: str) -> None:
        # What Redis does by itself at expiry: the lease hash goes, the
        # token counter stays.
        client.delete(svc.lease_key(key))

    def close() -> None:
        for c in clients:
            c.close()

    return Backend("redis", svc, make_peer, expire, [close])


@pytest.fixture(scope="session")
def _postgres_lease_schema(postgres_engine: sa.Engine) -> sa.Engine:
    SQLLeaseService(postgres_engine).create_schema()
    return postgres_engine


@pytest.fixture(scope="session")
def _mysql_lease_schema(mysql_engine: sa.Engine) -> sa.Engine:
    SQLLeaseService(mysql_engine).create_schema()
    return mysql_engine


@pytest.fixture(scope="session")
def lease_pooled_engine(
    _postgres_lease_schema: sa.Engine, postgres_url: str, pgbouncer_server: PgBouncer
) -> Iterator[sa.Engine]:
    """The session's PostgreSQL database through PgBouncer (transaction pooling)."""
    engine = pooled_engine(pgbouncer_server, postgres_url, pool_size=2, max_overflow=26)
    yield engine
    engine.dispose()


def make_backend(name: str, request: pytest.FixtureRequest) -> Backend:
    """Build backend ``name``; skips (or fails in CI) when its service is down."""
    if name == "memory":
        return _memory()
    if name in ("sqlite", "sqlite-readback"):
        engine = request.getfixturevalue("sqlite_engine")
        url = request.getfixturevalue("sqlite_url")
        backend = _sql(name, engine, url, None if name == "sqlite" else False)
        assert isinstance(backend.service, SQLLeaseService)
        backend.service.create_schema()
        return backend
    if name in ("postgres", "postgres-connection"):
        engine = request.getfixturevalue("_postgres_lease_schema")
        url = request.getfixturevalue("postgres_url")
        return _sql(name, engine, url, None, bound=name.endswith("-connection"))
    if name == POOLED:
        engine = request.getfixturevalue("lease_pooled_engine")
        return _sql(name, engine, str(engine.url), None)
    if name in ("mariadb", "mariadb-readback", "mariadb-connection"):
        engine = request.getfixturevalue("_mysql_lease_schema")
        url = request.getfixturevalue("mysql_url")
        use_returning = False if name == "mariadb-readback" else None
        return _sql(name, engine, url, use_returning, bound=name.endswith("-connection"))
    if name == "redis":
        request.getfixturevalue("redis_client")  # skips/fails when Redis is down
        return _redis(request.getfixturevalue("redis_namespace"))
    raise ValueError(name)


@pytest.fixture(params=BACKENDS + EXTRA_PATHS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each lease backend (and code path) in turn, fresh for the test."""
    b = make_backend(request.param, request)
    yield b
    b.close()


@pytest.fixture(params=[*BACKENDS, "postgres-connection"])
def hold_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each of the five backends, for the slower ``hold_lease`` tests.

    Plus a service bound to one connection, which the renewer thread and the
    body share. (The other extra paths change nothing ``hold_lease`` adds.)
    """
    b = make_backend(request.param, request)
    yield b
    b.close()


# --- a store that goes away ---------------------------------------------------


class StoreDown(ConnectionError):
    """Raised by :class:`FlakyService` while its simulated outage lasts."""


class FlakyService:
    """Wraps a lease service; every call fails while an outage lasts.

    ``stall()`` instead makes ``refresh`` hang until ``unstall()``: a renewer
    thread that cannot run (a paused process, a hung socket).
    """

    def __init__(self, inner: LeaseService) -> None:
        self.inner = inner
        self._down_until = 0.0
        self._running = threading.Event()
        self._running.set()
        self._lock = threading.Lock()
        self.refresh_ok = 0
        self.refresh_failed = 0
        self.refresh_ok_after_outage = 0

    def fail_for(self, seconds: float) -> None:
        with self._lock:
            self._down_until = time.monotonic() + seconds
            self.refresh_ok_after_outage = 0

    def restore(self) -> None:
        with self._lock:
            self._down_until = 0.0

    def stall(self) -> None:
        self._running.clear()

    def unstall(self) -> None:
        self._running.set()

    @property
    def down(self) -> bool:
        return time.monotonic() < self._down_until

    def _check(self) -> None:
        if self.down:
            raise StoreDown("lease store unreachable (simulated outage)")

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        self._check()
        return self.inner.acquire(key, holder, ttl)

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        assert self._running.wait(30), "stalled refresh was never released"
        try:
            self._check()
        except StoreDown:
            with self._lock:
                self.refresh_failed += 1
            raise
        out = self.inner.refresh(lease, ttl)
        with self._lock:
            self.refresh_ok += 1
            self.refresh_ok_after_outage += 1
        return out

    def release(self, lease: Lease) -> None:
        self._check()
        self.inner.release(lease)

    def get(self, key: str) -> Lease | None:
        self._check()
        return self.inner.get(key)
