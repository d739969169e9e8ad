"""Shared fixtures: real service connections, one scratch database per session."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from tests.helpers import in_process_worker
from tests.services import (
    MYSQL_ADMIN_URL,
    PG_ADMIN_URL,
    SESSION_TAG,
    reachable_redis,
    scratch_database,
    unavailable,
)
from tests.throwaway import (
    ThrowawayPostgres,
    ThrowawayRedis,
    ThrowawayServerError,
    throwaway_postgres,
    throwaway_redis,
)

pytest_plugins = (
    "celery.contrib.pytest",
    "tests.pg_connection_cap",
    "tests.pgbouncer",
    "tests.parallel",
)


@pytest.fixture
def celery_worker(
    celery_app: Any,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: dict[str, Any],
) -> Iterator[Any]:
    """celery.contrib.pytest's in-process worker, stopped at once after the test."""
    for module in celery_includes:
        celery_app.loader.import_task_module(module)
    with in_process_worker(celery_app, pool=celery_worker_pool, **celery_worker_parameters) as w:
        yield w


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with scratch_database(PG_ADMIN_URL, SESSION_TAG) as url:
        yield url


@pytest.fixture(scope="session")
def mysql_url() -> Iterator[str]:
    with scratch_database(MYSQL_ADMIN_URL, SESSION_TAG) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_engine(postgres_url: str) -> Iterator[sa.Engine]:
    # The shared server's slots are few: between tests the pool keeps two idle
    # connections; a race of many threads gets the rest, closed on return.
    engine = sa.create_engine(postgres_url, pool_size=2, max_overflow=26)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def mysql_engine(mysql_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(mysql_url, pool_size=30, max_overflow=10)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sqlite") / "pikku.db"
    return f"sqlite:///{path}"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Iterator[sa.Engine]:
    from pikku_celery.sql.engines import create_sqlite_engine

    engine = create_sqlite_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def redis_client() -> Iterator[redis.Redis]:
    _, client = reachable_redis()
    yield client
    for key in client.scan_iter(match=f"*{SESSION_TAG}*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture
def redis_namespace(request: pytest.FixtureRequest) -> str:
    """A key namespace unique to this session and test."""
    return f"{SESSION_TAG}:{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture(scope="module")
def throwaway_pg() -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL of the module's own, for tests that restart or crash it."""
    with ExitStack() as stack:
        try:
            server = stack.enter_context(throwaway_postgres())
        except (ThrowawayServerError, OSError) as exc:
            unavailable("throwaway postgresql", exc)
        yield server


@pytest.fixture(scope="module")
def throwaway_redis_server() -> Iterator[ThrowawayRedis]:
    """A Redis of the module's own, for tests that restart or flush it."""
    with ExitStack() as stack:
        try:
            server = stack.enter_context(throwaway_redis())
        except (ThrowawayServerError, OSError) as exc:
            unavailable("throwaway redis", exc)
        yield server
