"""The PostgreSQL lease statements run straight on libpq (``pikku_celery.sql.libpq``).

The conformance suite runs every rule through this path (and the cut line
through a TCP proxy); these tests cover what is particular to it: prepared
statements and their life on the server, a connection killed or interrupted
under it, the general path wherever the fast one must not go, and errors
that look exactly like the general path's.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from pikku_celery.lease import SQLLeaseService
from pikku_celery.sql.libpq import STATE_KEY
from tests.helpers import wait_until
from tests.lease.conftest import exercise, new_key
from tests.services import terminate_backend


@dataclass
class PgService:
    svc: SQLLeaseService
    engine: sa.Engine
    conn: sa.Connection | None

    def driver(self) -> psycopg.Connection[Any]:
        """The psycopg connection the service runs on (the pool holds just one)."""
        if self.conn is not None:
            return self.conn.connection.driver_connection  # type: ignore[return-value]
        fairy = self.engine.raw_connection()
        try:
            return fairy.driver_connection  # type: ignore[return-value]
        finally:
            fairy.close()

    def prepared(self) -> set[str]:
        rows = (
            self.driver()
            .execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'pikku_lease_%'")
            .fetchall()
        )
        return {r[0] for r in rows}


@pytest.fixture(params=["connection", "engine"])
def pg(
    request: pytest.FixtureRequest, postgres_url: str, _postgres_lease_schema: sa.Engine
) -> Iterator[PgService]:
    """A service bound to one connection, or on an engine whose pool holds one."""
    engine = sa.create_engine(postgres_url, pool_size=1, max_overflow=0)
    conn = engine.connect() if request.param == "connection" else None
    yield PgService(SQLLeaseService(conn if conn is not None else engine), engine, conn)
    if conn is not None:
        conn.close()
    engine.dispose()


def test_operations_run_as_prepared_statements(pg: PgService) -> None:
    assert pg.svc.on_libpq
    exercise(pg.svc)
    assert len(pg.prepared()) == 4  # acquire, refresh, release, get


def test_a_terminated_connection_fails_one_call_then_reconnects(
    pg: PgService, postgres_engine: sa.Engine
) -> None:
    key = new_key()
    lease = pg.svc.acquire(key, "A", 30.0)
    assert lease is not None
    old_pid = pg.driver().info.backend_pid
    terminate_backend(postgres_engine, old_pid)

    with pytest.raises(sa.exc.OperationalError) as info:
        pg.svc.refresh(lease, 30.0)
    assert info.value.connection_invalidated
    assert isinstance(info.value.orig, psycopg.OperationalError)
    if pg.conn is not None:
        assert pg.conn.invalidated

    # The next call reconnects and prepares its statements on the new backend.
    refreshed = pg.svc.refresh(lease, 30.0)
    assert refreshed is not None and refreshed.token == lease.token
    assert pg.driver().info.backend_pid != old_pid
    assert pg.svc.get(key) == refreshed
    exercise(pg.svc)
    assert len(pg.prepared()) == 4
    if pg.conn is not None:  # back in autocommit for the general path too
        assert pg.driver().autocommit


def test_statements_the_server_forgot_are_prepared_again(pg: PgService) -> None:
    exercise(pg.svc)
    pg.driver().execute("DEALLOCATE ALL")
    assert pg.prepared() == set()
    exercise(pg.svc)
    assert len(pg.prepared()) == 4


def test_a_connection_that_must_not_prepare_gets_none(
    postgres_url: str, _postgres_lease_schema: sa.Engine
) -> None:
    """``prepare_threshold=None`` (e.g. PgBouncer in transaction mode)."""
    engine = sa.create_engine(
        postgres_url, pool_size=1, max_overflow=0, connect_args={"prepare_threshold": None}
    )
    try:
        pg = PgService(SQLLeaseService(engine), engine, None)
        exercise(pg.svc)
        assert pg.prepared() == set()
        fairy = engine.raw_connection()
        try:
            assert fairy.info[STATE_KEY].named is False  # it did take the fast path
        finally:
            fairy.close()
    finally:
        engine.dispose()


def test_execution_event_listeners_still_see_every_statement(
    postgres_url: str, _postgres_lease_schema: sa.Engine
) -> None:
    engine = sa.create_engine(postgres_url, pool_size=1, max_overflow=0)
    seen: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(*args: Any) -> None:
        seen.append(args[2])

    try:
        exercise(SQLLeaseService(engine))
        assert len(seen) == 7
        assert all("pikku_lease" in s for s in seen)
    finally:
        engine.dispose()


def test_echo_still_logs_every_statement(
    postgres_url: str, _postgres_lease_schema: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    engine = sa.create_engine(postgres_url, pool_size=1, max_overflow=0, echo=True)
    try:
        with caplog.at_level("INFO", logger="sqlalchemy.engine"):
            exercise(SQLLeaseService(engine))
        assert sum("pikku_lease" in r.getMessage() for r in caplog.records) == 7
    finally:
        engine.dispose()


def test_a_server_error_is_the_general_paths_exception(pg: PgService) -> None:
    missing = SQLLeaseService(pg.conn if pg.conn is not None else pg.engine, table="no_such_lease")
    with pytest.raises(sa.exc.ProgrammingError) as info:
        missing.acquire(new_key(), "A", 5.0)
    assert isinstance(info.value.orig, psycopg.errors.UndefinedTable)
    assert not info.value.connection_invalidated
    assert "no_such_lease" in str(info.value)
    exercise(pg.svc)  # the connection is fine


def test_a_nul_byte_is_refused_as_before(pg: PgService) -> None:
    """libpq would cut a text parameter at the NUL: such a key goes the general path."""
    with pytest.raises(sa.exc.DataError):
        pg.svc.acquire("a\x00b", "A", 5.0)
    exercise(pg.svc)


class Interrupted(Exception):
    """Raised by a signal handler, as Celery's soft time limit is."""


def test_a_signal_interrupts_a_waiting_statement_and_drops_the_connection(
    pg: PgService, postgres_engine: sa.Engine
) -> None:
    svc, key = pg.svc, new_key()
    first = svc.acquire(key, "A", 30.0)
    assert first is not None
    svc.release(first)
    blocker = postgres_engine.connect()
    blocker.exec_driver_sql("SELECT 1 FROM pikku_lease WHERE key = %(k)s FOR UPDATE", {"k": key})

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        with pytest.raises(Interrupted):
            svc.acquire(key, "B", 30.0)  # waits on the row lock until the signal
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, previous)
        blocker.rollback()
        blocker.close()
    if pg.conn is not None:
        assert pg.conn.invalidated
    # The interrupted statement may still have run once the lock was gone;
    # either way "B" holds the key now, with the next token.
    taken = wait_until(lambda: svc.acquire(key, "B", 30.0), timeout=5)
    assert taken is not None and taken.token == first.token + 1
    exercise(svc)
