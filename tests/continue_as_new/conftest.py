"""The conformance suite's stores (memory, SQLite, PostgreSQL, MariaDB), and an
engine with an inline dispatcher on each.

The server stores get databases of their own: the store suite's session
fixtures, defined again here, would otherwise create and drop its databases
(by the same names) while its engines still hold connections to them.
"""

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.store import WorkflowStore
from tests.engine.conftest import Harness, make_harness
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG
from tests.store.conftest import (  # noqa: F401
    _server_stores,
    backend,
    migrated_engine,
    store,
)


@pytest.fixture(scope="session")
def store_pg_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(PG_ADMIN_URL, f"{SESSION_TAG}_continued")


@pytest.fixture(scope="session")
def store_mysql_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(MYSQL_ADMIN_URL, f"{SESSION_TAG}_continued")


@pytest.fixture
def h(store: WorkflowStore) -> Harness:  # noqa: F811
    return make_harness(store)
