"""The PostgreSQL fast path: hot statements straight on libpq.

Why: a lease operation is one short statement, and through SQLAlchemy and a
psycopg cursor the client spent more time on it than the server did (the
execution context, converting and dumping parameters, prepared-statement
bookkeeping), where this path takes about what a bare ``cursor.execute()`` of
a parameterless UPDATE does, most of it the kernel's socket work
(``benchmarks/leases.py`` measures both). A step's claim and
its pass are the same story with wider rows: psycopg built a column
description per row and per column, and re-parsed the pass statement on every
call (it is longer than psycopg's query cache takes).

So the PostgreSQL lease service and store
(:mod:`pikku_celery.lease.sql_postgres`, :class:`pikku_celery.sql.runner.LibpqRunner`)
compile each hot statement
once, with SQLAlchemy as before, into PostgreSQL's ``$n`` form, and run it on
the psycopg connection's libpq handle (``psycopg.Connection.pgconn``, psycopg's
public low-level API): a server-side prepared statement, text parameters, no
cursor; rows come back through psycopg's own loaders. Semantics do not
change: the SQL is the same, each statement is its own transaction (libpq
sends no BEGIN), and :func:`run_direct` maps errors back to the SQLAlchemy
exceptions the general path raises.

Waiting is a ``poll()`` on the socket, so signals (Ctrl-C, Celery's soft time
limit) are handled while a statement waits, as with psycopg's own wait.
"""

from __future__ import annotations

import hashlib
import math
import re
import select
from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg import pq
from psycopg.adapt import Transformer
from psycopg.errors import error_from_result

from .compat import (
    checkin_without_rollback,
    connection_has_listeners,
    connection_logs_statements,
    engine_has_listeners,
    engine_logs_statements,
    raise_connect_error,
    raise_dbapi_error,
)

_BIND = re.compile(r"%\((\w+)\)s|%%")

_IDLE = pq.TransactionStatus.IDLE
_UNKNOWN = pq.TransactionStatus.UNKNOWN
_FATAL = pq.ExecStatus.FATAL_ERROR
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name: DEALLOCATE/DISCARD ran
_DUPLICATE_STATEMENT = b"42P05"  # duplicate_prepared_statement: prepared already

# Where the fast path keeps its per-connection state: in the pool's info dict
# of the DBAPI connection, which SQLAlchemy clears when it reconnects.
STATE_KEY = "pikku_pg"


class PgStatement:
    """One statement compiled for libpq: ``$n`` parameters and their names in order.

    ``sql`` is the statement as SQLAlchemy renders it for psycopg, for error
    messages. The prepared statement's name is a hash of the text, so services
    sharing a connection share it, and one that differs gets its own.
    ``defaults`` are the values of the statement's own constants (literal
    values SQLAlchemy sends as parameters); ``floats`` names the parameters
    of a floating-point type (others take only integral floats).
    """

    __slots__ = ("columns", "defaults", "floats", "name", "names", "query", "sql")

    def __init__(
        self,
        sql: str,
        prefix: str = "pikku_",
        defaults: Mapping[str, object] | None = None,
        floats: frozenset[str] = frozenset(),
    ) -> None:
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) is None:
                return "%"  # pyformat's escaped percent sign
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        self.sql = sql
        self.defaults = dict(defaults or {})
        self.floats = floats
        self.query = _BIND.sub(number, sql).encode()
        self.names = tuple(names)
        digest = hashlib.sha1(self.query, usedforsecurity=False).hexdigest()[:24]
        self.name = f"{prefix}{digest}".encode()
        self.columns: tuple[str, ...] | None = None  # the result's, once it has run

    @classmethod
    def compile(
        cls, stmt: sa.Executable, dialect: sa.Dialect, prefix: str = "pikku_"
    ) -> PgStatement:
        """``stmt`` compiled for ``dialect`` (psycopg's), its constants and float
        parameters read off the compiled form."""
        c: Any = stmt.compile(dialect=dialect)  # type: ignore[attr-defined]
        binds = c.binds
        constants = {k: b.value for k, b in binds.items() if not b.required}
        floats = frozenset(k for k, b in binds.items() if isinstance(b.type, sa.Float))
        return cls(c.string, prefix, constants, floats)


class PgConnection:
    """What the fast path keeps per psycopg connection: which statements it prepared."""

    __slots__ = ("driver", "encoding", "loader", "named", "pgconn", "poll", "prepared")

    def __init__(self, driver: psycopg.Connection[Any]) -> None:
        self.driver = driver
        self.pgconn = driver.pgconn
        self.encoding = driver.info.encoding
        # A connection told not to prepare (prepare_threshold=None, e.g. behind
        # PgBouncer in transaction mode) gets unnamed statements instead.
        self.named = driver.prepare_threshold is not None
        self.prepared: set[bytes] = set()
        self.loader = Transformer(driver)
        self.poll = select.poll()
        self.poll.register(self.pgconn.socket, select.POLLIN)

    def usable(self) -> bool:
        """Not inside a transaction or a command someone else left running."""
        status = self.pgconn.transaction_status
        return status in (_IDLE, _UNKNOWN)

    def encode(self, params: Mapping[str, object], stmt: PgStatement) -> list[bytes | None] | None:
        """Text-format parameters; None for a value this path does not send.

        (libpq reads text parameters up to a NUL byte, so a string with one,
        or one the connection's encoding cannot take, goes the general path,
        which refuses it.)
        """
        out: list[bytes | None] = []
        defaults = stmt.defaults
        for name in stmt.names:
            value = params[name] if name in params else defaults[name]
            if isinstance(value, str):
                if "\x00" in value:
                    return None
                try:
                    out.append(value.encode(self.encoding))
                except UnicodeEncodeError:
                    return None
            elif value is None:
                out.append(None)
            elif isinstance(value, bool):  # before int: a bool is an int
                out.append(b"t" if value else b"f")
            elif isinstance(value, int):
                out.append(b"%d" % value)
            elif isinstance(value, float) and math.isfinite(value):
                if name in stmt.floats:
                    out.append(repr(value).encode())
                elif value.is_integer():
                    # An integer parameter given a float: psycopg's binding
                    # casts it, where its text would be refused.
                    out.append(b"%d" % value)
                else:
                    return None
            else:
                return None
        return out

    def run(self, stmt: PgStatement, params: Mapping[str, object]) -> pq.abc.PGresult | None:
        """Run ``stmt`` with ``params``; None when this path does not take them
        (see :meth:`encode`) or the connection is inside a transaction."""
        if not self.usable():
            return None
        values = self.encode(params, stmt)
        return None if values is None else self.execute(stmt, values)

    def rows(self, res: pq.abc.PGresult) -> list[tuple[Any, ...]]:
        """The result's rows as tuples, loaded by psycopg's own loaders."""
        loader = self.loader
        loader.set_pgresult(res)
        return loader.load_rows(0, res.ntuples, tuple)

    def execute(self, stmt: PgStatement, params: list[bytes | None]) -> pq.abc.PGresult:
        """Run ``stmt``; raise the psycopg error for a failed one."""
        pg = self.pgconn
        if not self.named:
            pg.send_query_params(stmt.query, params)
            return self._check(self._wait())
        if stmt.name not in self.prepared:
            self._prepare(stmt)
        pg.send_query_prepared(stmt.name, params)
        res = self._wait()
        if res.status == _FATAL and res.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            # Someone ran DEALLOCATE ALL or DISCARD ALL: the statement did not
            # run at all, so prepare it again and run it.
            self.prepared.discard(stmt.name)
            self._prepare(stmt)
            pg.send_query_prepared(stmt.name, params)
            res = self._wait()
        return self._check(res)

    def _prepare(self, stmt: PgStatement) -> None:
        self.pgconn.send_prepare(stmt.name, stmt.query)
        res = self._wait()
        if res.status != _FATAL or res.error_field(_SQLSTATE) != _DUPLICATE_STATEMENT:
            self._check(res)
        self.prepared.add(stmt.name)

    def _check(self, res: pq.abc.PGresult) -> pq.abc.PGresult:
        if res.status not in _OK:
            raise error_from_result(res, encoding=self.encoding)
        return res

    def _wait(self) -> pq.abc.PGresult:
        """Send what is buffered, wait for the reply, return its (last) result."""
        pg = self.pgconn
        while pg.flush():  # nonblocking connection: the socket buffer was full
            select.select([], [pg.socket], [])
        poll = self.poll.poll
        while True:
            pg.consume_input()
            if not pg.is_busy():
                break
            poll()
        res = pg.get_result()
        if res is None:
            raise psycopg.OperationalError("the server sent no result")
        while (more := pg.get_result()) is not None:
            if res.status in _OK:
                res = more
        return res


def run_direct(
    conn: sa.Connection, stmt: PgStatement, params: Mapping[str, object]
) -> list[Any] | None:
    """Run ``stmt`` on ``conn``'s psycopg connection, straight on libpq; its rows.

    None: this call takes the general path instead (a value libpq cannot
    take as text, execution event listeners to fire or ``echo`` on, a
    transaction left open on the connection). Driver errors come out as
    SQLAlchemy would raise them.
    """
    if connection_logs_statements(conn) or _traced(conn):
        # Tracing or SQL logging: SQLAlchemy fires the events and logs.
        return None
    try:
        return _rows_on(conn.connection, stmt, params)
    except psycopg.Error as err:
        # What SQLAlchemy does with a driver error outside an execution
        # context: the same exception types, the connection (and on a
        # disconnect the pool) invalidated, handle_error events fired.
        raise_dbapi_error(conn, err, stmt.sql, dict(params), None)
        raise AssertionError("unreachable") from err  # pragma: no cover - it always raises
    except BaseException as err:
        # Not the database's: an exception from a signal handler (Ctrl-C,
        # Celery's soft time limit) while the statement ran. It propagates
        # as it is, and the connection, whose line is now in an unknown
        # state, is dropped.
        if not conn.invalidated:
            conn.invalidate(err)
        raise


def run_pooled(
    engine: sa.Engine, stmt: PgStatement, params: Mapping[str, object]
) -> list[Any] | None:
    """:func:`run_direct` on a connection of ``engine``'s pool.

    The connection comes straight from the pool, without the
    :class:`~sqlalchemy.engine.Connection` around it (its set-up and
    tear-down cost as much client CPU as the statement), and goes back
    without the pool's reset ``ROLLBACK`` when libpq left it idle. While the
    engine logs or has listeners (``echo``, tracing, ``engine_connect``) the
    statement runs through a ``Connection`` as before, so they see it.
    None: this call takes the general path instead.
    """
    if engine_has_listeners(engine) or engine_logs_statements(engine):
        with engine.connect() as conn:
            return run_direct(conn, stmt, params)
    try:
        fairy = engine.raw_connection()
    except psycopg.Error as err:  # cannot connect: raised as engine.connect() would
        raise_connect_error(err, engine)
        raise AssertionError("unreachable") from err  # pragma: no cover - it always raises
    try:
        rows = _rows_on(fairy, stmt, params)
    except psycopg.Error as err:
        # As run_direct: the error as SQLAlchemy raises it, the connection
        # (and on a disconnect the pool) invalidated; closing the Connection
        # returns it to the pool.
        with sa.Connection(engine, fairy) as conn:
            raise_dbapi_error(conn, err, stmt.sql, dict(params), None)
        raise AssertionError("unreachable") from err  # pragma: no cover - it always raises
    except BaseException as err:
        fairy.invalidate(err)  # a signal mid-statement: its line is in an unknown state
        raise
    state: PgConnection = fairy.info[STATE_KEY]
    if rows is not None and state.pgconn.transaction_status == _IDLE:
        checkin_without_rollback(fairy)  # nothing to roll back
    else:
        fairy.close()
    return rows


def _rows_on(fairy: Any, stmt: PgStatement, params: Mapping[str, object]) -> list[Any] | None:
    """``stmt``'s rows on a pooled connection; the result's column names are
    kept on the statement the first time. None: the general path's call."""
    state: PgConnection | None = fairy.info.get(STATE_KEY)
    driver = fairy.driver_connection
    if state is None or state.driver is not driver:  # new, or made again after a reconnect
        state = fairy.info[STATE_KEY] = PgConnection(driver)
    res = state.run(stmt, params)
    if res is None:
        return None
    if stmt.columns is None:
        stmt.columns = tuple((res.fname(i) or b"").decode() for i in range(res.nfields))
    return state.rows(res)


def _traced(conn: sa.Connection) -> bool:
    """Whether statement events are listened for (tracing, query logging).

    Other events do not count: an engine made with
    ``execution_options(isolation_level=...)`` listens for ``engine_connect``.
    """
    if not (connection_has_listeners(conn) or engine_has_listeners(conn.engine)):
        return False
    d = conn.dispatch
    return bool(
        d.before_execute or d.after_execute or d.before_cursor_execute or d.after_cursor_execute
    )
