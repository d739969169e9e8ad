"""Pins of :mod:`pikku_celery.sql.compat`: every SQLAlchemy private name pikku uses.

Each test fails, saying what changed, when a SQLAlchemy release drops one of
those names, changes its parameters, or stops doing what pikku relies on.
``scripts/test`` runs them on the newest SQLAlchemy and on the lowest
``pyproject.toml`` allows (``PIKKU_EXPECT_SQLALCHEMY`` names the version that
run must be on).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sqlite3
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from packaging.requirements import Requirement
from sqlalchemy import event
from sqlalchemy.pool import _ConnectionFairy

from pikku_celery.sql import compat
from tests.services import terminate_backend

VERSION = sa.__version__
ROOT = Path(__file__).resolve().parents[2]


def changed(what: str, function: str) -> str:
    return (
        f"SQLAlchemy {VERSION}: {what}; pikku_celery.sql.compat.{function} "
        "must change with it (see its docstring)"
    )


# -- the SQLAlchemy this runs on ----------------------------------------------------


def test_runs_on_the_sqlalchemy_expected() -> None:
    """The lowest-SQLAlchemy run really runs on it, not on the venv's newest."""
    expected = os.environ.get("PIKKU_EXPECT_SQLALCHEMY")
    if expected:
        assert sa.__version__ == expected, (
            f"expected SQLAlchemy {expected}, imported {VERSION} from {sa.__file__}"
        )


def test_runs_on_a_sqlalchemy_pyproject_allows() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = (Requirement(d) for d in deps if Requirement(d).name.lower() == "sqlalchemy")
    assert req.specifier.contains(VERSION), f"SQLAlchemy {VERSION} is outside {req}"


# -- names and signatures -----------------------------------------------------------

# (owner, private callable, the parameters pikku passes, in order, the compat function)
CALLABLES = [
    (
        sa.Connection,
        "_handle_dbapi_exception",
        ("self", "e", "statement", "parameters", "cursor", "context"),
        "raise_dbapi_error",
    ),
    (
        sa.Connection,
        "_handle_dbapi_exception_noconnection",
        ("e", "dialect", "engine"),  # a classmethod: no cls
        "raise_connect_error",
    ),
    (sa.Engine, "_should_log_info", ("self",), "engine_logs_statements"),
    (_ConnectionFairy, "_close_special", ("self", "transaction_reset"), "checkin_without_rollback"),
]


@pytest.mark.parametrize(
    ("owner", "name", "leading", "function"), CALLABLES, ids=[c[1] for c in CALLABLES]
)
def test_private_callable_takes_what_pikku_passes(
    owner: type, name: str, leading: tuple[str, ...], function: str
) -> None:
    target = getattr(owner, name, None)
    assert callable(target), changed(f"{owner.__name__}.{name} is gone", function)
    params = list(inspect.signature(target).parameters.values())
    found = ", ".join(str(p) for p in params)
    assert tuple(p.name for p in params[: len(leading)]) == leading, changed(
        f"{owner.__name__}.{name} takes ({found}), not ({', '.join(leading)}, ...)", function
    )
    assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[: len(leading)]), changed(
        f"{owner.__name__}.{name}'s parameters are ({found})", function
    )
    rest = [p.name for p in params[len(leading) :] if p.default is p.empty]
    assert not rest, changed(f"{owner.__name__}.{name} also requires {rest}", function)


def test_private_attributes_exist() -> None:
    assert isinstance(sa.Engine._has_events, bool), changed(
        "Engine._has_events is gone", "engine_has_listeners"
    )
    engine = sa.create_engine("sqlite://")
    try:
        with engine.connect() as conn:
            assert isinstance(conn._echo, bool), changed(
                "Connection._echo is gone", "connection_logs_statements"
            )
            assert isinstance(conn._has_events, bool), changed(
                "Connection._has_events is gone", "connection_has_listeners"
            )
    finally:
        engine.dispose()


def test_an_incompatible_sqlalchemy_fails_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing or reshaped private name stops pikku at import, with a clear error."""
    monkeypatch.delitem(sys.modules, "pikku_celery.sql.compat")
    monkeypatch.delattr(sa.Connection, "_handle_dbapi_exception")
    with pytest.raises(RuntimeError, match=r"private Connection\._handle_dbapi_exception\("):
        importlib.import_module("pikku_celery.sql.compat")
    monkeypatch.undo()

    monkeypatch.delitem(sys.modules, "pikku_celery.sql.compat")
    monkeypatch.setattr(_ConnectionFairy, "_close_special", lambda self, reset=False: None)
    with pytest.raises(RuntimeError, match=r"has with other parameters: \(self, reset\)"):
        importlib.import_module("pikku_celery.sql.compat")
    monkeypatch.undo()
    assert sys.modules["pikku_celery.sql.compat"] is compat


# -- behaviour ----------------------------------------------------------------------


@pytest.fixture
def engine() -> Iterator[sa.Engine]:
    engine = sa.create_engine("sqlite://", poolclass=sa.pool.QueuePool)
    yield engine
    engine.dispose()


@pytest.fixture
def engine_logger() -> Iterator[logging.Logger]:
    """SQLAlchemy's statement logger, its level and handlers restored after."""
    logger = logging.getLogger("sqlalchemy.engine.Engine")
    level, handlers = logger.level, list(logger.handlers)
    assert not logger.isEnabledFor(logging.INFO), "the test run logs SQL: cannot test echo"
    yield logger
    logger.setLevel(level)
    for h in logger.handlers[:]:
        if h not in handlers:  # echo=True adds a stream handler
            logger.removeHandler(h)


def test_logs_statements_follows_echo_and_logging(
    engine: sa.Engine, engine_logger: logging.Logger
) -> None:
    def logs() -> tuple[bool, bool]:
        with engine.connect() as conn:
            return compat.engine_logs_statements(engine), compat.connection_logs_statements(conn)

    assert logs() == (False, False), changed("a quiet engine logs", "*_logs_statements")
    engine.echo = True
    assert logs() == (True, True), changed("echo=True does not log", "*_logs_statements")
    engine.echo = False
    assert logs() == (False, False), changed("echo=False still logs", "*_logs_statements")
    engine_logger.setLevel(logging.INFO)
    assert logs() == (True, True), changed("the logger at INFO does not log", "*_logs_statements")


def test_engine_has_listeners_after_a_statement_listener(engine: sa.Engine) -> None:
    assert not compat.engine_has_listeners(engine), changed(
        "a new engine has listeners", "engine_has_listeners"
    )
    event.listen(engine, "before_cursor_execute", lambda *a: None)
    assert compat.engine_has_listeners(engine), changed(
        "a before_cursor_execute listener leaves Engine._has_events false",
        "engine_has_listeners",
    )
    with engine.connect() as conn:
        # libpq._traced reads the statement events off the connection's dispatch.
        assert conn.dispatch.before_cursor_execute, "engine listeners miss the connection"


def test_engine_has_listeners_after_an_engine_connect_listener(engine: sa.Engine) -> None:
    event.listen(engine, "engine_connect", lambda conn: None)
    assert compat.engine_has_listeners(engine), changed(
        "an engine_connect listener leaves Engine._has_events false", "engine_has_listeners"
    )


def test_connection_has_listeners_of_its_own(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        assert not compat.connection_has_listeners(conn), changed(
            "a new connection has listeners", "connection_has_listeners"
        )
        event.listen(conn, "before_cursor_execute", lambda *a: None)
        assert compat.connection_has_listeners(conn), changed(
            "a listener on the Connection leaves Connection._has_events false",
            "connection_has_listeners",
        )
        assert conn.dispatch.before_cursor_execute
    assert not compat.engine_has_listeners(engine), "a connection's listener reached the engine"


def driver_error(cursor: Any, sql: str) -> Exception:
    try:
        cursor.execute(sql)
    except Exception as exc:
        return exc
    raise AssertionError(f"{sql!r} did not fail")


def test_raise_dbapi_error_raises_sqlalchemys_error(engine: sa.Engine) -> None:
    handled: list[Any] = []
    event.listen(engine, "handle_error", handled.append)
    with engine.connect() as conn:
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        err = driver_error(cursor, "SELECT * FROM nowhere")
        assert isinstance(err, sqlite3.OperationalError)
        with pytest.raises(sa.exc.DBAPIError) as raised:
            compat.raise_dbapi_error(conn, err, "SELECT * FROM nowhere", {"x": 1}, cursor)
        e = raised.value
        what = "raise_dbapi_error"
        assert type(e) is sa.exc.OperationalError, changed(f"raised {type(e)}", what)
        assert e.orig is err and e.__cause__ is err, changed("the driver error not wrapped", what)
        assert (e.statement, e.params) == ("SELECT * FROM nowhere", {"x": 1}), changed(
            f"statement {e.statement!r}, params {e.params!r}", what
        )
        assert not e.connection_invalidated and not conn.invalidated, changed(
            "an error that is no disconnect invalidated the connection", what
        )
        assert [h.original_exception for h in handled] == [err], changed(
            "handle_error listeners not called", what
        )
        assert handled[0].connection is conn
        with pytest.raises(sqlite3.ProgrammingError, match="closed cursor"):
            cursor.execute("SELECT 1")  # closed by SQLAlchemy
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1  # the connection still works


def test_raise_dbapi_error_on_a_disconnect_invalidates_connection_and_pool(
    postgres_url: str,
) -> None:
    """PostgreSQL, as on the fast path: the backend killed under a connection."""
    engine = sa.create_engine(postgres_url, pool_size=2)
    connects: list[object] = []
    event.listen(engine, "connect", lambda dbapi, rec: connects.append(dbapi))
    what = "raise_dbapi_error"
    conn = engine.connect()
    try:
        with engine.connect() as other:  # a second connection, back in the pool
            other.exec_driver_sql("SELECT 1")
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        conn.rollback()
        assert isinstance(pid, int)
        terminate_backend(engine, pid)  # through the pooled one
        made = len(connects)
        driver = conn.connection.driver_connection
        err = driver_error(driver, "SELECT 1")
        assert isinstance(err, psycopg.OperationalError)
        with pytest.raises(sa.exc.DBAPIError) as raised:
            compat.raise_dbapi_error(conn, err, "SELECT 1", {}, None)
        e = raised.value
        assert type(e) is sa.exc.OperationalError and e.orig is err, changed(
            f"raised {type(e)} for {type(err)}", what
        )
        assert e.connection_invalidated and conn.invalidated, changed(
            "a disconnect did not invalidate the connection", what
        )
        # The pool too: the connection checked in before the disconnect is
        # replaced at its next checkout.
        with engine.connect() as fresh:
            assert fresh.exec_driver_sql("SELECT 1").scalar() == 1
        assert len(connects) == made + 1, changed("the pool was not invalidated", what)
    finally:
        conn.close()
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_raise_connect_error_raises_as_connect_does(backend: str, tmp_path: Path) -> None:
    url = {
        "sqlite": f"sqlite:///{tmp_path}/missing/pikku.db",  # no such directory
        "postgresql": "postgresql+psycopg://postgres@127.0.0.1:1/test",  # nothing listens
    }[backend]
    engine = sa.create_engine(url)
    handled: list[Any] = []
    event.listen(engine, "handle_error", handled.append)
    what = "raise_connect_error"
    try:
        with pytest.raises(sa.exc.DBAPIError) as general:
            engine.connect()
        with pytest.raises(engine.dialect.loaded_dbapi.Error) as driver:
            engine.raw_connection()
        err = driver.value
        with pytest.raises(sa.exc.DBAPIError) as raised:
            compat.raise_connect_error(err, engine)
        e, g = raised.value, general.value
        assert type(e) is type(g), changed(f"raised {type(e)}, connect() {type(g)}", what)
        assert e.orig is err and e.__cause__ is err, changed("the driver error not wrapped", what)
        assert type(e.orig) is type(g.orig)
        assert e.connection_invalidated == g.connection_invalidated
        assert [h.original_exception for h in handled] == [g.orig, err], changed(
            "handle_error listeners not called", what
        )
        assert handled[1].connection is None and handled[1].engine is engine
    finally:
        engine.dispose()


class CountingConnection(sqlite3.Connection):
    """An SQLite connection counting its rollbacks."""

    rollbacks = 0

    def rollback(self) -> None:
        self.rollbacks += 1
        super().rollback()


def test_checkin_without_rollback_returns_the_connection_unrolled() -> None:
    engine = sa.create_engine(
        "sqlite://",
        creator=lambda: sqlite3.connect(":memory:", factory=CountingConnection),
        poolclass=sa.pool.QueuePool,
        pool_size=1,
        max_overflow=0,
    )
    resets: list[bool] = []
    event.listen(
        engine, "reset", lambda dbapi, rec, state: resets.append(state.transaction_was_reset)
    )
    what = "checkin_without_rollback"
    try:
        fairy = engine.raw_connection()
        driver = fairy.driver_connection
        assert isinstance(driver, CountingConnection)
        counted: CountingConnection = driver
        rollbacks = counted.rollbacks  # the dialect's first-connect set-up may roll back
        fairy.close()  # the usual check-in, for contrast: the reset rolls back
        assert (resets, counted.rollbacks) == ([False], rollbacks + 1)

        fairy = engine.raw_connection()
        assert fairy.driver_connection is driver
        compat.checkin_without_rollback(fairy)
        assert counted.rollbacks == rollbacks + 1, changed("the pool rolled back anyway", what)
        assert resets == [False, True], changed(
            f"reset events saw transaction_was_reset {resets}", what
        )
        pool: Any = engine.pool  # a QueuePool
        assert pool.checkedout() == 0, changed("the connection was not checked in", what)
        again = engine.raw_connection()
        assert again.driver_connection is driver, changed("the connection left the pool", what)
        again.close()
    finally:
        engine.dispose()
