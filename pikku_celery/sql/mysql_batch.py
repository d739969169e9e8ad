"""Several statements in one round trip on MySQL/MariaDB.

MySQL has no ``UPDATE ... RETURNING`` and no data-modifying CTEs, so a claim
(the guarded UPDATE, the attempt row, the superseded mark, the read back) and
its COMMIT would cost five round trips. PyMySQL connections opened with the
``MULTI_STATEMENTS`` client flag (engines from :func:`pikku_celery.sql.engines.make_engine`
have it) take them as one batch; the server runs the statements in order and
stops at the first error, which rolls the batch's transaction back when the
connection returns to the pool. Connections without the flag use the one
statement per round trip path.

The batch runs on the driver's own cursor; its errors go through SQLAlchemy's
own handler (as in the lease service's PostgreSQL fast path), so callers'
retry and outage handling is the same for both paths.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from pymysql.constants import CLIENT, SERVER_STATUS
from pymysql.converters import escape_item
from sqlalchemy.sql.compiler import SQLCompiler

from .compat import raise_dbapi_error
from .runner import Runner

CLEAN_AFTER_BATCH = "pikku_clean_after_batch"
"""Key in a pool record's ``info``: a batch left the connection outside a
transaction, so its check-in needs no ROLLBACK."""

MULTI_STATEMENTS: int = CLIENT.MULTI_STATEMENTS


class Batch:
    """Statements compiled once for PyMySQL, sent joined by ``;``.

    Each statement compiles with its own anonymous parameters (``status_1``
    in one is not ``status_1`` in the next), so every placeholder of the
    caller's values gets its statement's prefix. The statements' own
    constants are rendered into the text once: a call then binds (and
    escapes) only the caller's values, cheaper on the client than
    SQLAlchemy's ``construct_params`` per statement.
    """

    def __init__(
        self,
        dialect: sa.Dialect,
        statements: Sequence[sa.ClauseElement | str],
        rows_of: int | None = None,
    ) -> None:
        """``rows_of``: the statement whose rows the batch answers with (by
        index); None: the first statement's row count, as one row."""
        if dialect.paramstyle != "pyformat":
            raise ValueError(f"batches are built for PyMySQL, not {dialect.driver}")
        self._names: list[tuple[str, str]] = []  # (placeholder, caller's name)
        parts = []
        for i, stmt in enumerate(statements):
            if isinstance(stmt, str):
                parts.append(stmt)
            else:
                compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
                parts.append(self._render(compiled, f"b{i}_"))
        self.sql = ";\n".join(parts)
        self.commits = parts[-1].strip().upper() == "COMMIT"
        self.rows_of = rows_of

    def _render(self, compiled: SQLCompiler, prefix: str) -> str:
        return _NAMED.sub(lambda m: self._bind(compiled, prefix, m[1]), str(compiled))

    def _bind(self, compiled: SQLCompiler, prefix: str, name: str) -> str:
        """A placeholder for the caller's value, or the constant's own literal."""
        bind = compiled.binds[name]
        if bind.required or bind.callable is not None:
            self._names.append((prefix + name, name))
            return f"%({prefix}{name})s"
        return str(escape_item(bind.value, "utf8mb4")).replace("%", "%%")

    def parameters(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The driver's parameters for the whole batch."""
        return {placeholder: params[name] for placeholder, name in self._names}


# A pyformat placeholder (a literal percent sign compiles to ``%%``).
_NAMED = re.compile(r"(?<!%)%\(([^)]+)\)s")


class NamedRow:
    """A row a batch read, by column name as attribute and in ``_mapping``
    (as SQLAlchemy's rows are read); values as the driver returned them."""

    __slots__ = ("_mapping",)

    def __init__(self, names: Sequence[str], values: Sequence[Any]) -> None:
        self._mapping = dict(zip(names, values, strict=True))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


def takes_batches(conn: sa.Connection) -> bool:
    """Whether this connection's driver runs several statements per call."""
    driver: Any = conn.connection.driver_connection
    flags = getattr(driver, "client_flag", 0)
    return isinstance(flags, int) and bool(flags & MULTI_STATEMENTS)


def in_transaction(driver: Any) -> bool:
    """The server's own word (in every OK packet) on an open transaction.

    Unknown drivers answer True, so a pool reset then rolls back as usual.
    """
    status = getattr(driver, "server_status", None)
    if not isinstance(status, int):
        return True
    return bool(status & SERVER_STATUS.SERVER_STATUS_IN_TRANS)


def run_batch(
    conn: sa.Connection, batch: Batch, params: Mapping[str, Any]
) -> list[tuple[int, list[tuple[Any, ...]] | None, list[str] | None]]:
    """Run ``batch``; for each statement (rowcount, rows or None, column names)."""
    driver: Any = conn.connection.driver_connection
    cursor = driver.cursor()
    out: list[tuple[int, list[tuple[Any, ...]] | None, list[str] | None]] = []
    try:
        cursor.execute(batch.sql, batch.parameters(params))
        while True:
            if cursor.description is None:
                out.append((cursor.rowcount, None, None))
            else:
                names = [d[0] for d in cursor.description]
                out.append((cursor.rowcount, list(cursor.fetchall()), names))
            if not cursor.nextset():
                break
        if batch.commits:
            # Ended outside any transaction: the pool need not roll back.
            conn.connection.info[CLEAN_AFTER_BATCH] = True
    except conn.dialect.loaded_dbapi.Error as exc:
        # SQLAlchemy's own handling, as for a statement it ran: the same
        # exception types, a rollback, handle_error events, and on a
        # disconnect the connection (and pool) invalidated.
        raise_dbapi_error(conn, exc, batch.sql, params, cursor)
    finally:
        with contextlib.suppress(Exception):  # a dead connection cannot drain its results
            cursor.close()
    return out


class BatchRunner:
    """A :class:`Batch` as one round trip; any other statement through ``fallback``."""

    def __init__(self, engine: sa.Engine, fallback: Runner) -> None:
        self.engine = engine
        self.fallback = fallback

    def rows(self, statement: Any, params: Mapping[str, Any]) -> Sequence[Any]:
        """The batch's answer (see :class:`Batch`), or the statement's rows."""
        if not isinstance(statement, Batch):
            return self.fallback.rows(statement, params)
        with self.engine.connect() as conn:
            results = run_batch(conn, statement, params)
        if statement.rows_of is None:
            return [(results[0][0],)]
        return results[statement.rows_of][1] or []
