"""Store fixtures: one conformance suite over memory, SQLite, PostgreSQL, MariaDB.

PostgreSQL and MariaDB get a scratch database of their own per session, made
by pikku's migrations (``upgrade``), so the suite also proves the migrated
schema is the one the store runs on. Every test starts from empty tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import make_engine
from pikku_celery.sql.schema import (
    attempt_table,
    audit_table,
    concurrency_key_table,
    concurrency_slot_table,
    run_key_table,
    run_table,
    signal_table,
    step_table,
)
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from tests.pgbouncer import PgBouncer, pooled_engine
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG, scratch_database

BACKENDS = ["memory", "sqlite", "postgres", "mariadb"]


def migrated_engine(admin_url: str, name: str) -> Iterator[sa.Engine]:
    from pikku_celery.store.migrate import upgrade

    with scratch_database(admin_url, name) as url:
        upgrade(url)
        # Few idle connections kept between tests (the server is shared).
        engine = make_engine(url, pool_size=2, max_overflow=26)
        try:
            yield engine
        finally:
            engine.dispose()


@pytest.fixture(scope="session")
def store_pg_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(PG_ADMIN_URL, f"{SESSION_TAG}_store")


@pytest.fixture(scope="session")
def store_mysql_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(MYSQL_ADMIN_URL, f"{SESSION_TAG}_store")


POOLED = "postgres-pgbouncer"
"""The PostgreSQL store through PgBouncer in transaction pooling (the
conformance suite's extra backend)."""


@pytest.fixture(scope="session")
def store_pooled_engine(
    store_pg_engine: sa.Engine, pgbouncer_server: PgBouncer
) -> Iterator[sa.Engine]:
    """The PostgreSQL store's database through PgBouncer (transaction pooling)."""
    engine = pooled_engine(pgbouncer_server, store_pg_engine.url, pool_size=2, max_overflow=26)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def _server_stores() -> dict[str, SQLWorkflowStore]:
    return {}


def wipe(engine: sa.Engine) -> None:
    """Empty pikku's store tables (children first)."""
    with engine.begin() as conn:
        for table in (
            concurrency_slot_table,
            concurrency_key_table,
            audit_table,
            attempt_table,
            signal_table,
            step_table,
            run_key_table,
            run_table,
        ):
            conn.execute(table.delete())


SERVERS = {"postgres": "store_pg_engine", "mariadb": "store_mysql_engine"}


@pytest.fixture(params=sorted(SERVERS))
def server_engine(request: pytest.FixtureRequest) -> sa.Engine:
    """PostgreSQL's and MariaDB's store engines in turn, over empty tables:
    for what both do in one go (the optimistic pass, a run with its first pass)."""
    engine: sa.Engine = request.getfixturevalue(SERVERS[request.param])
    wipe(engine)
    return engine


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(backend: str, request: pytest.FixtureRequest) -> WorkflowStore:
    if backend == "memory":
        return InMemoryWorkflowStore()
    if backend == "sqlite":
        return store_for(request.getfixturevalue("sqlite_engine"))
    cache: dict[str, SQLWorkflowStore] = request.getfixturevalue("_server_stores")
    if backend == POOLED:
        wipe(request.getfixturevalue("store_pg_engine"))
        if backend not in cache:
            pooled = request.getfixturevalue("store_pooled_engine")
            cache[backend] = store_for(pooled, pooler="transaction")
        return cache[backend]
    engine_fixture = "store_pg_engine" if backend == "postgres" else "store_mysql_engine"
    engine: sa.Engine = request.getfixturevalue(engine_fixture)
    wipe(engine)
    if backend not in cache:
        cache[backend] = store_for(engine)
    return cache[backend]


def one_connection_store(url: sa.URL) -> tuple[SQLWorkflowStore, sa.Engine]:
    """A store whose engine holds one connection (traces and kills hit it)."""
    engine = sa.create_engine(url, pool_size=1, max_overflow=0)
    return store_for(engine), engine


@pytest.fixture
def pg_one_store(store_pg_engine: sa.Engine) -> Iterator[SQLWorkflowStore]:
    """A PostgreSQL store on one connection, over empty tables."""
    wipe(store_pg_engine)
    made, engine = one_connection_store(store_pg_engine.url)
    yield made
    engine.dispose()
