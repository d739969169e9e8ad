"""Every SQLAlchemy private name pikku uses, each behind one small function.

The PostgreSQL fast path (:mod:`pikku_celery.sql.libpq`) and MySQL's batches
(:mod:`pikku_celery.sql.mysql_batch`) run statements beside SQLAlchemy's own
execution, yet must behave as if SQLAlchemy had run them: take the general
path while someone logs or listens, raise SQLAlchemy's exceptions (with its
invalidation on a disconnect and its ``handle_error`` events), return a
connection to the pool without a needless ``ROLLBACK``. SQLAlchemy exposes
no public API for those, so pikku calls its private ones, here and nowhere
else: ``tests/sql/test_compat.py`` pins each name's existence, signature and
the behaviour pikku relies on, and ``scripts/test`` runs those tests on the
lowest SQLAlchemy pikku allows as well as on the newest.

These are called per statement on the hot path, so each is a plain function
doing the attribute access. Names that a SQLAlchemy release could drop or
reshape are checked once, when this module is imported: an incompatible
SQLAlchemy fails there, loudly, instead of on some later statement.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn, cast

import sqlalchemy as sa
from sqlalchemy.pool import _ConnectionFairy

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPICursor
    from sqlalchemy.pool import PoolProxiedConnection

__all__ = [
    "checkin_without_rollback",
    "connection_has_listeners",
    "connection_logs_statements",
    "engine_has_listeners",
    "engine_logs_statements",
    "raise_connect_error",
    "raise_dbapi_error",
]


def connection_logs_statements(conn: sa.Connection) -> bool:
    """Whether ``conn`` logs its statements (``echo``, or the
    ``sqlalchemy.engine`` logger at INFO): the fast path then leaves the
    statement to SQLAlchemy, which logs it.

    ``Connection._echo``: SQLAlchemy sets it when the connection is made, from
    ``Engine._should_log_info()``, and tests it before logging each statement.
    """
    return conn._echo


def engine_logs_statements(engine: sa.Engine) -> bool:
    """Whether connections of ``engine`` would log statements now (``echo``, or
    the ``sqlalchemy.engine`` logger at INFO): the pooled fast path then runs the
    statement through a ``Connection``, which logs it.

    ``Engine._should_log_info()``: what SQLAlchemy asks when it makes a
    ``Connection`` (:func:`connection_logs_statements` is its answer then).
    """
    return engine._should_log_info()


def engine_has_listeners(engine: sa.Engine) -> bool:
    """Whether connection events (``before_cursor_execute``, ``engine_connect``,
    ...) have ever been listened for on ``engine``: the pooled fast path then
    runs the statement through a ``Connection``, so they fire.

    ``Engine._has_events``: SQLAlchemy sets it when a connection event listener
    is added to the engine, and tests it before dispatching any of them.
    """
    return engine._has_events


def connection_has_listeners(conn: sa.Connection) -> bool:
    """Whether connection events have been listened for on ``conn`` itself
    (on SQLAlchemy 2.0 also: on its engine when it was made).

    ``Connection._has_events``: SQLAlchemy tests it, with its engine's, before
    dispatching a connection event.
    """
    return conn._has_events


def raise_dbapi_error(
    conn: sa.Connection,
    err: Exception,
    statement: str,
    params: Mapping[str, Any] | None,
    cursor: DBAPICursor | None,
) -> NoReturn:
    """Raise ``err``, a driver error from a statement pikku ran on ``conn``'s
    DBAPI connection itself, as SQLAlchemy raises one from its own execution,
    so callers' retry and outage handling sees no difference.

    ``Connection._handle_dbapi_exception``, with no execution context: wraps
    ``err`` in the matching :class:`sqlalchemy.exc.DBAPIError` subclass, runs
    ``handle_error`` listeners, closes ``cursor`` and rolls back (outside a
    transaction) or, on a disconnect, invalidates the connection and the pool.
    """
    conn._handle_dbapi_exception(err, statement, params, cursor, None)


def raise_connect_error(err: Exception, engine: sa.Engine) -> NoReturn:
    """Raise ``err``, the driver's error from ``engine.raw_connection()``, as
    ``engine.connect()`` raises it.

    ``Connection._handle_dbapi_exception_noconnection``: what ``Connection``
    does when its pool cannot connect: wraps ``err`` in the matching
    :class:`sqlalchemy.exc.DBAPIError` subclass and runs ``handle_error``
    listeners.
    """
    sa.Connection._handle_dbapi_exception_noconnection(err, engine.dialect, engine)


def checkin_without_rollback(fairy: PoolProxiedConnection) -> None:
    """Return ``fairy`` (from ``engine.raw_connection()``) to its pool without
    the pool's reset ``ROLLBACK``: the caller knows its connection is outside
    any transaction (libpq says it is idle), so the round trip would be waste.

    ``_ConnectionFairy._close_special(transaction_reset=True)``: how
    ``Connection.close()`` returns a connection whose transaction it already
    ended; the pool's ``reset`` event still fires, with
    ``transaction_was_reset`` true, and the pool skips its ``ROLLBACK``.
    """
    # What engine.raw_connection() returns; typed so on every SQLAlchemy 2.x
    # (2.0's PoolProxiedConnection declares no __getattr__), as SQLAlchemy does.
    cast(_ConnectionFairy, fairy)._close_special(transaction_reset=True)


# -- checked once, at import --------------------------------------------------------


def _fail(name: str, what: str) -> NoReturn:
    raise RuntimeError(
        f"pikku-celery needs SQLAlchemy's private {name}, which SQLAlchemy "
        f"{sa.__version__} {what}; install a SQLAlchemy release pikku-celery supports "
        "(see its pyproject.toml) and report this incompatibility to pikku-celery"
    )


def _require_attribute(owner: type, name: str) -> None:
    """``owner.name`` exists: on the class, or set on each instance by
    ``owner.__init__`` (whose code is checked, as there is no instance yet)."""
    if hasattr(owner, name):
        return
    code = getattr(vars(owner).get("__init__"), "__code__", None)
    if code is None or name not in code.co_names:
        _fail(f"{owner.__name__}.{name}", "no longer has")


def _require_callable(owner: type, name: str, leading: tuple[str, ...]) -> None:
    """``owner.name`` exists and takes ``leading`` as its first parameters (the
    ones pikku passes); any others have defaults."""
    wanted = f"{owner.__name__}.{name}({', '.join(leading)})"
    if not callable(getattr(owner, name, None)):
        _fail(wanted, "no longer has")
    params = list(inspect.signature(getattr(owner, name)).parameters.values())
    names = tuple(p.name for p in params[: len(leading)])
    if names != leading or any(p.default is p.empty for p in params[len(leading) :]):
        found = ", ".join(p.name for p in params)
        _fail(wanted, f"has with other parameters: ({found})")


_require_attribute(sa.Connection, "_echo")
_require_callable(sa.Engine, "_should_log_info", ("self",))
_require_attribute(sa.Engine, "_has_events")
_require_attribute(sa.Connection, "_has_events")
_require_callable(
    sa.Connection,
    "_handle_dbapi_exception",
    ("self", "e", "statement", "parameters", "cursor", "context"),
)
# A classmethod: its signature has no ``cls``.
_require_callable(sa.Connection, "_handle_dbapi_exception_noconnection", ("e", "dialect", "engine"))
_require_callable(_ConnectionFairy, "_close_special", ("self", "transaction_reset"))
