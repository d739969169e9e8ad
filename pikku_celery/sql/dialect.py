"""What differs between the databases pikku runs on, decided once per engine.

:func:`create` is the one place a database's name is read: everything else
asks the :class:`Dialect` it returns for a capability (``insert_returning``),
a spelling (``upsert``, ``now_ms``) or a judgement (``transient``), so
portable code never compares dialect names.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from .transient import rolled_back, savepoint_lost


class Upsert(enum.Enum):
    """How an insert that meets an existing key updates it instead."""

    ON_CONFLICT = "on_conflict"
    """``INSERT ... ON CONFLICT DO UPDATE`` (PostgreSQL, SQLite): every
    assignment sees the row as it was."""
    ON_DUPLICATE_KEY = "on_duplicate_key"
    """``INSERT ... ON DUPLICATE KEY UPDATE`` (MySQL/MariaDB): assignments run
    left to right, each seeing the columns already assigned."""


_CLOCKS = {
    # clock_timestamp(), not now(): now() is frozen for the whole transaction.
    "postgresql": "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
    # UTC_TIMESTAMP(6) ignores the session's time zone.
    "mysql": "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)",
    # The host clock: SQLite is single-host by nature.
    "sqlite": "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
}
_FAMILIES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


def family(dialect_name: str) -> str:
    """The family a SQLAlchemy dialect name belongs to (MariaDB is MySQL's)."""
    try:
        return _FAMILIES[dialect_name]
    except KeyError:
        raise ValueError(f"unsupported database dialect: {dialect_name}") from None


def now_ms_sql(dialect_name: str) -> str:
    """SQL for "now" in epoch milliseconds on the database's own clock."""
    return _CLOCKS[family(dialect_name)]


@dataclass(frozen=True)
class Dialect:
    """One database's differences, as values (made by :func:`create`)."""

    name: str
    """SQLAlchemy's name for the family (``postgresql``, ``mysql``, ``sqlite``):
    for messages and registries keyed per dialect, never for branching."""
    now_ms: sa.ColumnElement[int]
    """"Now" in epoch milliseconds on the database's clock."""
    upsert: Upsert
    insert: Callable[[sa.Table], Any]
    """The dialect's own ``insert(table)``, which has its upsert clause."""
    autocommit_single: bool
    """A statement on its own runs in autocommit: no BEGIN/COMMIT round trips
    (PostgreSQL; elsewhere a one-statement transaction is as cheap or the
    driver needs it)."""
    prepared: bool
    """Single statements may run as prepared statements straight on libpq
    (PostgreSQL over psycopg)."""
    batches: bool
    """Several statements may go in one round trip (MySQL/MariaDB over
    PyMySQL, on connections with its multi-statement flag)."""
    skip_flush: sa.ColumnElement[bool] | None
    """A condition that makes its one-statement transaction commit without
    waiting for the WAL flush (PostgreSQL's ``SET LOCAL synchronous_commit``),
    for writes whose loss in a crash is harmless; None where there is none."""
    embedded: bool
    """The database is a file the application owns (SQLite): a store on it
    creates its tables on first use; a server's are made by ``db upgrade``."""
    transient: Callable[[BaseException], bool]
    """The error means: run the whole transaction again (a deadlock victim, a
    lock wait timed out, MySQL's savepoint lost with its transaction)."""
    sa_dialect: sa.Dialect = field(repr=False, compare=False)

    @property
    def insert_returning(self) -> bool:
        """``INSERT ... RETURNING`` (MariaDB >= 10.5 yes, MySQL no).

        Read when asked: SQLAlchemy learns the server's version on the first
        connection, which may come after this object is made."""
        return bool(self.sa_dialect.insert_returning)

    @property
    def update_returning(self) -> bool:
        """``UPDATE ... RETURNING`` (MySQL/MariaDB no; SQLite >= 3.35 yes), read when asked."""
        return bool(self.sa_dialect.update_returning)


class HasDialect(Protocol):
    """An Engine, a Connection, or a mock engine: anything with SQLAlchemy's dialect."""

    @property
    def dialect(self) -> sa.Dialect:
        """SQLAlchemy's dialect of the database it talks to."""
        ...


def _transient(exc: BaseException) -> bool:
    return rolled_back(exc) or savepoint_lost(exc)


_MADE: weakref.WeakKeyDictionary[sa.Dialect, Dialect] = weakref.WeakKeyDictionary()


def create(bind: HasDialect) -> Dialect:
    """The :class:`Dialect` of ``bind``'s database: the one place it is chosen.

    One per engine: the store and the lease service on the same engine (or
    its connections) get the same object, and the statements built over it.
    """
    made = _MADE.get(bind.dialect)
    if made is None:
        made = _MADE[bind.dialect] = _make(bind.dialect)
    return made


def _make(sa_dialect: sa.Dialect) -> Dialect:
    name = family(sa_dialect.name)
    now = sa.literal_column(_CLOCKS[name], sa.BigInteger())
    common: dict[str, Any] = {
        "name": name,
        "now_ms": now,
        "sa_dialect": sa_dialect,
        "transient": _transient,
        "embedded": name == "sqlite",
    }
    if name == "postgresql":
        return Dialect(
            upsert=Upsert.ON_CONFLICT,
            insert=postgresql.insert,
            autocommit_single=True,
            prepared=sa_dialect.driver == "psycopg",
            batches=False,
            skip_flush=sa.literal_column(
                "set_config('synchronous_commit', 'off', true)", sa.Text()
            ).is_not(None),
            **common,
        )
    if name == "mysql":
        return Dialect(
            upsert=Upsert.ON_DUPLICATE_KEY,
            insert=mysql.insert,
            autocommit_single=False,
            prepared=False,
            batches=sa_dialect.driver == "pymysql",
            skip_flush=None,
            **common,
        )
    return Dialect(
        upsert=Upsert.ON_CONFLICT,
        insert=sqlite.insert,
        autocommit_single=False,
        prepared=False,
        batches=False,
        skip_flush=None,
        **common,
    )
