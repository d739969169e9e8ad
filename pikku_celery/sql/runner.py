"""One statement, its rows: the interface the SQL store and lease service run through.

Behind it sit plain SQLAlchemy (every dialect), the libpq prepared-statement
path (PostgreSQL over psycopg: :mod:`pikku_celery.sql.libpq`) and MySQL's
multi-statement batches (:mod:`pikku_celery.sql.mysql_batch`). Callers never
know which ran: errors are SQLAlchemy's either way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

if TYPE_CHECKING:
    from .libpq import PgStatement


class Runner(Protocol):
    """Runs one statement on its own (autocommit, or a transaction of its own)."""

    def rows(self, statement: Any, params: Mapping[str, Any]) -> Sequence[Any]:
        """The statement's rows (attribute access and ``_mapping``, as SQLAlchemy's)."""
        ...


class SQLAlchemyRunner:
    """Through SQLAlchemy's ordinary path, each statement in the transaction
    ``begin()`` opens (``engine.begin``: its own; autocommit when the engine
    carries that isolation level)."""

    def __init__(self, begin: Callable[[], AbstractContextManager[sa.Connection]]) -> None:
        self.begin = begin

    def rows(self, statement: Any, params: Mapping[str, Any]) -> Sequence[Any]:
        """The statement's rows (none for a write without RETURNING), in a
        transaction of its own."""
        with self.begin() as conn:
            result = conn.execute(statement, params)
            return result.all() if result.returns_rows else []


class Row:
    """A row of the libpq path: attribute access and ``_mapping``, as SQLAlchemy's rows."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


class LibpqRunner:
    """PostgreSQL over psycopg: each statement compiled once and run as a
    prepared statement straight on libpq; a call the fast path cannot take
    (listeners to notify, a connection in an odd state) goes to ``fallback``.

    On a connection of the engine's pool, or on ``connection`` (kept in
    autocommit by its owner, used under ``lock``). Prepared statements are
    named ``prefix`` + a hash of their SQL.
    """

    def __init__(
        self,
        engine: sa.Engine,
        fallback: Runner,
        *,
        prefix: str = "pikku_",
        connection: sa.Connection | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        # Imported here: psycopg is loaded only by stores that use it.
        from .libpq import PgStatement, run_direct, run_pooled

        self.engine = engine
        self.fallback = fallback
        self.prefix = prefix
        self.connection = connection
        self._lock = lock or threading.Lock()
        self._compile = PgStatement.compile
        self._pooled = run_pooled
        self._direct = run_direct
        # By the statement's identity: statements are built once.
        self._compiled: dict[int, tuple[Any, PgStatement]] = {}

    def rows(self, statement: Any, params: Mapping[str, Any]) -> Sequence[Any]:
        """The statement's rows, as a prepared statement on libpq where it can."""
        found = self._compiled.get(id(statement))
        if found is None or found[0] is not statement:
            compiled = self._compile(statement, self.engine.dialect, self.prefix)
            found = self._compiled[id(statement)] = (statement, compiled)
        compiled = found[1]
        conn = self.connection
        if conn is None:
            # No isolation level to set: libpq sends no BEGIN of its own.
            rows = self._pooled(self.engine, compiled, params)
        else:
            with self._lock:
                if conn.invalidated:
                    # Reconnect now, in autocommit for the general path too.
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                rows = self._direct(conn, compiled, params)
        if rows is None:
            return self.fallback.rows(statement, params)
        names = compiled.columns  # the result's, kept on the statement by its first run
        assert names is not None
        return [Row(dict(zip(names, values, strict=True))) for values in rows]
