"""PostgreSQL behind a connection pooler (PgBouncer): what pikku gives up there.

In transaction pooling each transaction may run on another server connection,
so nothing may rely on session state: protocol-level prepared statements
(PgBouncer before 1.21 does not carry them between server connections),
a session ``SET``, ``LISTEN`` (notices reach a server connection the client no
longer holds). With ``pooler="transaction"`` psycopg prepares nothing
(``prepare_threshold=None``; pikku's libpq path then sends unnamed
statements) and ``RunHandle.wait`` polls instead of listening.

What pikku keeps in every mode: its one setting, ``synchronous_commit = off``
for a claim or a release, is ``set_config(..., true)``, local to that
statement's transaction; ``NOTIFY`` is part of a transaction too, so a run's
settle notice still reaches processes that listen on a direct or
session-pooled connection.

Without the setting, the store's first use checks whether a pooler answered
(:func:`pooler_seen`) and warns (:class:`~pikku_celery.errors.PoolerWarning`).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import event

from ..errors import PoolerWarning

log = logging.getLogger(__name__)

Pooler = Literal["transaction", "session"]
POOLERS: tuple[Pooler, ...] = ("transaction", "session")


def check_pooler(pooler: object, engine: sa.Engine | None = None) -> Pooler | None:
    """``pooler`` if it is one pikku knows (or None); a setting for a database
    that is not PostgreSQL is refused, naming itself."""
    if pooler is None:
        return None
    if pooler not in POOLERS:
        raise ValueError(f"pooler must be one of {POOLERS} or None, not {pooler!r}")
    if engine is not None and engine.dialect.name != "postgresql":
        raise ValueError(
            f"pooler={pooler!r} is for PostgreSQL behind a pooler such as PgBouncer; "
            f"this database is {engine.dialect.name}"
        )
    return pooler


def _prepare_nothing(dbapi_conn: Any, _record: Any) -> None:
    """psycopg prepares no statement on this connection (its libpq path then
    sends unnamed ones)."""
    if hasattr(dbapi_conn, "prepare_threshold"):
        dbapi_conn.prepare_threshold = None


def use_pooler(engine: sa.Engine, pooler: Pooler | None) -> None:
    """Make ``engine``'s new connections fit ``pooler`` (idempotent).

    Transaction pooling: no protocol-level prepared statements. Connections
    the pool already holds keep what they had: set it before first use.
    """
    if pooler != "transaction":
        return
    if not event.contains(engine, "connect", _prepare_nothing):
        event.listen(engine, "connect", _prepare_nothing)


def prepares_nothing(engine: sa.Engine) -> bool:
    """Whether :func:`use_pooler` set ``engine`` up for transaction pooling."""
    return event.contains(engine, "connect", _prepare_nothing)


def pooler_seen(engine: sa.Engine) -> str | None:
    """Why a pooler seems to sit between ``engine`` and PostgreSQL, or None.

    Two signs, one connection: the backend pid libpq was told at connect
    (a pooler makes one up, PgBouncer a random one) is not the server's
    ``pg_backend_pid()``; or two transactions ran on two server processes.
    """
    with engine.connect() as conn:
        driver = conn.connection.driver_connection
        told = getattr(getattr(driver, "info", None), "backend_pid", None)
        first = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.commit()
        second = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        conn.rollback()
    if first != second:
        return (
            f"two transactions of one connection ran on server processes {first} and "
            f"{second}: transaction pooling"
        )
    if told is not None and told != first:
        return f"the connection was told backend pid {told}, the server runs it as {first}"
    return None


def warn_if_pooled(engine: sa.Engine) -> str | None:
    """Warn (:class:`PoolerWarning`) when a pooler answers ``engine`` and no
    ``pooler=`` says so; the reason, or None."""
    try:
        reason = pooler_seen(engine)
    except sa.exc.DBAPIError:  # the check is advice: the store's own call reports outages
        return None
    if reason is None:
        return None
    message = (
        f"pikku-celery's PostgreSQL connection goes through a connection pooler ({reason}). "
        "Behind PgBouncer in transaction pooling set Pikku(..., pooler='transaction') "
        "(or store_for(engine, pooler='transaction')): without it psycopg prepares "
        "statements the pooler may send to another server connection, and wait() listens "
        "on a connection it does not keep; in session pooling set pooler='session'."
    )
    log.warning("%s", message)
    warnings.warn(message, PoolerWarning, stacklevel=2)
    return reason
