"""The narrow connector and the Dialect, on every database pikku runs on.

What services rely on: a statement runs by its registered name; a write
reports the rows it matched on every path (libpq's included); a transaction
commits together or not at all; a transaction the database rolled back to
let another through is run again as a whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pymysql
import pytest
import sqlalchemy as sa

from pikku_celery.sql.connector import (
    LibpqConnector,
    MySQLBatchConnector,
    Registry,
    SQLAlchemyConnector,
    Transaction,
    connect,
)
from pikku_celery.sql.dialect import Upsert, create
from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.recording import RecordingConnector

NAMES = ["sqlite", "postgres", "mariadb"]


@pytest.fixture(params=NAMES)
def engine(request: pytest.FixtureRequest) -> sa.Engine:
    fixture = {"sqlite": "sqlite_engine", "postgres": "postgres_engine", "mariadb": "mysql_engine"}
    found: sa.Engine = request.getfixturevalue(fixture[request.param])
    return found


@pytest.fixture
def table(engine: sa.Engine) -> Iterator[sa.Table]:
    """A table of its own for the test, with three rows."""
    t = sa.Table(
        f"connector_{time.monotonic_ns()}",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("n", sa.Integer, nullable=False),
    )
    with engine.begin() as conn:
        t.create(conn)
        conn.execute(t.insert(), [{"id": i, "n": 0} for i in (1, 2, 3)])
    yield t
    with engine.begin() as conn:
        t.drop(conn)


def statements(t: sa.Table) -> dict[str, sa.Executable]:
    p = sa.bindparam
    bump = t.update().where(t.c.id <= p("upto")).values(n=t.c.n + 1)
    return {
        "t.get": sa.select(t.c.id, t.c.n).where(t.c.id == p("get_id")),
        "t.all": sa.select(t.c.id, t.c.n).order_by(t.c.id),
        "t.bump": bump,
        "t.bump_returning": bump.returning(t.c.id),
        "t.add": t.insert().values(id=p("new_id"), n=0),
    }


def test_statements_run_by_name_and_writes_count_what_they_matched(
    engine: sa.Engine, table: sa.Table
) -> None:
    conn = connect(engine, Registry(statements(table)), prefix="pikku_test_")
    assert conn.run("t.bump", {"upto": 2}) == 2
    if conn.dialect.update_returning:
        assert conn.run("t.bump_returning", {"upto": 1}) == 1
    else:
        assert conn.run("t.bump", {"upto": 1}) == 1
    assert conn.run("t.bump", {"upto": 0}) == 0
    row = conn.one("t.get", {"get_id": 1})
    assert row is not None and (row.id, row.n) == (1, 2)
    assert conn.one("t.get", {"get_id": 9}) is None
    assert [(r.id, r.n) for r in conn.all("t.all", {})] == [(1, 2), (2, 1), (3, 0)]
    assert isinstance(conn, LibpqConnector) == (engine.dialect.driver == "psycopg")


def test_a_transaction_commits_together_or_not_at_all(engine: sa.Engine, table: sa.Table) -> None:
    conn = connect(engine, Registry(statements(table)))

    def bump_then_clash(tx: Transaction) -> None:
        assert tx.run("t.bump", {"upto": 3}) == 3
        raise RuntimeError("the work gave up")

    with pytest.raises(RuntimeError):
        conn.transaction(bump_then_clash)
    assert conn.run("t.bump", {"upto": 3}) == 3  # on its own: kept

    def bump_then_add_twice(tx: Transaction) -> None:
        tx.run("t.bump", {"upto": 3})
        tx.run("t.add", {"new_id": 4})
        tx.run("t.add", {"new_id": 4})

    with pytest.raises(sa.exc.IntegrityError):
        conn.transaction(bump_then_add_twice)
    assert [r.n for r in conn.all("t.all", {})] == [1, 1, 1]  # no second bump, no row 4


@pytest.mark.parametrize("made_by", ["make_engine", "create_engine"])
def test_a_batch_answers_one_statements_rows_and_commits_together(
    engine: sa.Engine, table: sa.Table, made_by: str
) -> None:
    """On MySQL/MariaDB engines from ``make_engine`` the batch is one round
    trip (SQLAlchemy sees no statement of it); elsewhere statement by statement."""
    own = make_engine(str(engine.url.render_as_string(hide_password=False)))
    if made_by == "create_engine":
        own.dispose()
        own = sa.create_engine(engine.url)
    sent: list[str] = []
    sa.event.listen(own, "before_cursor_execute", lambda *a: sent.append(a[2]))
    try:
        conn = connect(own, Registry(statements(table)))
        bump_get = ["t.bump", "t.get"]
        rows = conn.batch(bump_get, {"upto": 1, "get_id": 1})
        assert [(r.id, r.n) for r in rows] == [(1, 1)]
        assert conn.batch(bump_get, {"upto": 3, "get_id": 2}, answer=None) == [(3,)]
        one_batch = isinstance(conn, MySQLBatchConnector) and made_by == "make_engine"
        assert not [s for s in sent if "UPDATE" in s] if one_batch else len(sent) >= 4
        with pytest.raises(sa.exc.IntegrityError):
            conn.batch(["t.bump", "t.add", "t.add"], {"upto": 3, "new_id": 4})
        assert [(r.id, r.n) for r in conn.all("t.all", {})] == [(1, 2), (2, 1), (3, 1)]
    finally:
        own.dispose()


def test_a_connection_of_ones_own_is_shared_by_threads_and_kept(
    engine: sa.Engine, table: sa.Table
) -> None:
    with engine.connect() as bound:
        conn = SQLAlchemyConnector(bound, registry=Registry(statements(table)))
        threads = [
            threading.Thread(target=lambda: [conn.run("t.bump", {"upto": 3}) for _ in range(20)])
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.close()  # the connection stays the caller's
        assert not bound.closed
        assert [r.n for r in conn.all("t.all", {})] == [80, 80, 80]


def test_a_name_is_bound_once() -> None:
    t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    registry = Registry({"t.all": sa.select(t)})
    registry.add({"t.all": registry["t.all"]})  # the same statement again: fine
    with pytest.raises(ValueError, match=r"t\.all"):
        registry.add({"t.all": sa.select(t.c.id)})
    with pytest.raises(KeyError, match=r"t\.none"):
        registry["t.none"]


def test_the_dialect_is_read_from_the_engine(engine: sa.Engine) -> None:
    dialect = create(engine)
    with engine.connect() as conn:
        db_now = int(conn.execute(sa.select(dialect.now_ms)).scalar_one())
    assert abs(db_now - time.time() * 1000) < 5_000  # epoch ms on a clock near ours
    on_mysql = engine.dialect.name in ("mysql", "mariadb")
    assert (dialect.upsert is Upsert.ON_DUPLICATE_KEY) == on_mysql
    assert dialect.insert_returning == bool(engine.dialect.insert_returning)
    assert (
        (dialect.skip_flush is not None)
        == dialect.autocommit_single
        == (engine.dialect.name == "postgresql")
    )


def deadlock_victim() -> sa.exc.OperationalError:
    orig = pymysql.err.OperationalError(1213, "Deadlock found when trying to get lock")
    return sa.exc.OperationalError("UPDATE ...", {}, orig)


def savepoint_gone() -> sa.exc.OperationalError:
    orig = pymysql.err.OperationalError(1305, "SAVEPOINT sp does not exist")
    return sa.exc.OperationalError("RELEASE SAVEPOINT sp", {}, orig)


@pytest.mark.parametrize("error", [deadlock_victim, savepoint_gone])
def test_a_transaction_rolled_back_by_the_database_runs_again_as_a_whole(
    error: Callable[[], sa.exc.OperationalError],
) -> None:
    t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    rec = RecordingConnector(create(sa.create_mock_engine("mariadb+pymysql://", None)))
    rec.register({"t.all": sa.select(t), "t.add": t.insert()})
    rec.fail["t.add"] = error()

    def work(tx: Transaction) -> int:
        tx.all("t.all", {})
        return int(tx.run("t.add", {"id": 1}))

    rec.answers["t.add"] = [()]
    assert rec.transaction(work) == 1
    assert [(c.name, c.transaction) for c in rec.calls] == [
        ("t.all", 1),
        ("t.add", 1),
        ("t.all", 2),
        ("t.add", 2),
    ]


def test_any_other_error_is_not_retried() -> None:
    t = sa.Table("t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    rec = RecordingConnector(create(sa.create_mock_engine("postgresql+psycopg://", None)))
    rec.register({"t.add": t.insert()})
    rec.fail["t.add"] = sa.exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
    with pytest.raises(sa.exc.IntegrityError):
        rec.run("t.add", {"id": 1})
    assert rec.names() == ["t.add"]
    with pytest.raises(KeyError):
        rec.one("t.missing", {})
