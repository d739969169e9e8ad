"""The PostgreSQL fast path: the lease statements straight on libpq.

Why: a lease operation is one short statement, and through SQLAlchemy and a
psycopg cursor the client spent more time on it than the server did: ~200 µs
of client CPU per operation (the execution context, converting and dumping
parameters, prepared-statement bookkeeping), where this path takes about what
a bare ``cursor.execute()`` of a parameterless UPDATE does (~100 µs on the
benchmark machine, most of it the kernel's socket work).

So :class:`~pikku_celery.lease.sql.SQLLeaseService` compiles each statement
once, with SQLAlchemy as before, into PostgreSQL's ``$n`` form, and runs it on
the psycopg connection's libpq handle (``psycopg.Connection.pgconn``, psycopg's
public low-level API): a server-side prepared statement, text parameters, no
cursor. Semantics do not change: the SQL is the same, each statement is its
own transaction (libpq sends no BEGIN), and the service maps errors back to
the SQLAlchemy exceptions the general path raises.

Waiting is a ``poll()`` on the socket, so signals (Ctrl-C, Celery's soft time
limit) are handled while a statement waits, as with psycopg's own wait.
"""

from __future__ import annotations

import hashlib
import re
import select
from collections.abc import Mapping
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result

_BIND = re.compile(r"%\((\w+)\)s|%%")

_IDLE = pq.TransactionStatus.IDLE
_UNKNOWN = pq.TransactionStatus.UNKNOWN
_FATAL = pq.ExecStatus.FATAL_ERROR
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_NO_SUCH_STATEMENT = b"26000"  # invalid_sql_statement_name: DEALLOCATE/DISCARD ran
_DUPLICATE_STATEMENT = b"42P05"  # duplicate_prepared_statement: prepared already


class PgStatement:
    """One statement compiled for libpq: ``$n`` parameters and their names in order.

    ``sql`` is the statement as SQLAlchemy renders it for psycopg, for error
    messages. The prepared statement's name is a hash of the text, so services
    sharing a connection share it, and one that differs gets its own.
    """

    __slots__ = ("name", "names", "query", "sql")

    def __init__(self, sql: str) -> None:
        names: list[str] = []

        def number(m: re.Match[str]) -> str:
            if m.group(1) is None:
                return "%"  # pyformat's escaped percent sign
            if m.group(1) not in names:
                names.append(m.group(1))
            return f"${names.index(m.group(1)) + 1}"

        self.sql = sql
        self.query = _BIND.sub(number, sql).encode()
        self.names = tuple(names)
        digest = hashlib.sha1(self.query, usedforsecurity=False).hexdigest()[:24]
        self.name = f"pikku_lease_{digest}".encode()


class PgConnection:
    """What the fast path keeps per psycopg connection: which statements it prepared."""

    __slots__ = ("driver", "encoding", "named", "pgconn", "poll", "prepared")

    def __init__(self, driver: psycopg.Connection[Any]) -> None:
        self.driver = driver
        self.pgconn = driver.pgconn
        self.encoding = driver.info.encoding
        # A connection told not to prepare (prepare_threshold=None, e.g. behind
        # PgBouncer in transaction mode) gets unnamed statements instead.
        self.named = driver.prepare_threshold is not None
        self.prepared: set[bytes] = set()
        self.poll = select.poll()
        self.poll.register(self.pgconn.socket, select.POLLIN)

    def usable(self) -> bool:
        """Not inside a transaction or a command someone else left running."""
        status = self.pgconn.transaction_status
        return status in (_IDLE, _UNKNOWN)

    def encode(self, params: Mapping[str, object], stmt: PgStatement) -> list[bytes] | None:
        """Text-format parameters; None for a value this path does not send.

        (libpq reads text parameters up to a NUL byte, so a string with one,
        or one the connection's encoding cannot take, goes the general path,
        which refuses it.)
        """
        out = []
        for name in stmt.names:
            value = params[name]
            if type(value) is int:
                out.append(b"%d" % value)
            elif type(value) is str and "\x00" not in value:
                try:
                    out.append(value.encode(self.encoding))
                except UnicodeEncodeError:
                    return None
            else:
                return None
        return out

    def execute(self, stmt: PgStatement, params: list[bytes]) -> pq.abc.PGresult:
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
