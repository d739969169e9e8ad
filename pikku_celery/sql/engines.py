"""Engines and the database clock, shared by the SQL lease service and store.

Every lease and step deadline is judged on the database's clock, expressed as
epoch milliseconds so the same integer arithmetic works on every dialect.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import StoreError
from ..extras import extra_for, install_hint
from .dialect import now_ms_sql

__all__ = ["READ_ONLY_OPTION", "create_sqlite_engine", "make_engine", "now_ms_expr", "now_ms_sql"]


def now_ms_expr(dialect_name: str) -> sa.ColumnElement[int]:
    """:func:`~.dialect.now_ms_sql` as a typed SQLAlchemy expression (a
    :class:`~.dialect.Dialect` carries it as ``now_ms``)."""
    return sa.literal_column(now_ms_sql(dialect_name), sa.BigInteger())


READ_ONLY_OPTION = "pikku_read_only"
"""An execution option: this connection's transactions only read (on SQLite
they then begin deferred, taking no write lock)."""


def create_sqlite_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An SQLite engine fit for several threads and processes.

    WAL lets readers run beside one writer; ``BEGIN IMMEDIATE`` takes the write
    lock up front so two writers wait on ``busy_timeout`` instead of
    deadlocking on a lock upgrade.
    """
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # A reader that asks (READ_ONLY) takes no write lock: it reads a WAL
        # snapshot beside the writer instead of queueing behind it.
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def _pymysql_engine(url: str, **kwargs: Any) -> sa.Engine:
    """A MySQL/MariaDB engine whose connections take multi-statement batches.

    The store sends a claim and its COMMIT as one batch
    (:mod:`pikku_celery.sql.mysql_batch`), which needs PyMySQL's
    ``MULTI_STATEMENTS`` client flag. Such a batch leaves the connection
    outside any transaction; returning it to the pool then skips the
    ``ROLLBACK`` round trip. Every other check-in rolls back as usual.
    """
    from .mysql_batch import CLEAN_AFTER_BATCH, MULTI_STATEMENTS, in_transaction

    custom_reset = "pool_reset_on_return" in kwargs
    if not custom_reset:
        kwargs["pool_reset_on_return"] = None
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "do_connect")
    def _multi_statements(
        _dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]
    ) -> None:
        # ORed into the flags SQLAlchemy set (FOUND_ROWS, which the store's
        # rowcounts rely on), never replacing them.
        cparams["client_flag"] = int(cparams.get("client_flag", 0)) | MULTI_STATEMENTS

    if not custom_reset:

        @event.listens_for(engine, "checkout")
        def _forget_batch(_dbapi: Any, record: Any, _proxy: Any) -> None:
            record.info.pop(CLEAN_AFTER_BATCH, None)

        @event.listens_for(engine, "reset")
        def _rollback_unless_clean(dbapi: Any, record: Any, state: Any) -> None:
            clean = record.info.pop(CLEAN_AFTER_BATCH, False)
            if state.terminate_only or state.transaction_was_reset:
                return
            if clean and not in_transaction(dbapi):
                return
            dbapi.rollback()

    return engine


def make_engine(url: str, **kwargs: Any) -> sa.Engine:
    """An engine for ``url`` with the settings pikku relies on.

    No ``pool_pre_ping``: a ping is a round trip per checkout on the hot path;
    callers retry on ``OperationalError`` instead. MySQL/MariaDB over PyMySQL:
    connections take multi-statement batches (see :func:`_pymysql_engine`).
    """
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise StoreError(
            "cannot parse the workflow database URL (expected e.g. "
            "postgresql+psycopg://user@host/db, mysql+pymysql://..., sqlite:///file.db)"
        ) from None
    try:
        if u.get_backend_name() == "sqlite":
            return create_sqlite_engine(url, **kwargs)
        kwargs.setdefault("pool_size", 10)
        kwargs.setdefault("max_overflow", 20)
        if u.get_backend_name() in ("mysql", "mariadb"):
            kwargs.setdefault("pool_recycle", 3600)
            if u.get_driver_name() == "pymysql":
                return _pymysql_engine(url, **kwargs)
        return sa.create_engine(url, **kwargs)
    except (sa.exc.NoSuchModuleError, ImportError) as exc:
        extra = extra_for(exc) if isinstance(exc, ImportError) else None
        why = f"{exc}: {install_hint(extra)}" if extra else str(exc)
        raise StoreError(
            f"cannot open the workflow database {u.render_as_string(hide_password=True)}: {why}"
        ) from None
