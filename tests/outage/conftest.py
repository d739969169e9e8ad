"""The outage tests' database, reached through a line the test can cut."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.lease.tcp_proxy import TcpProxy
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database


@pytest.fixture(scope="session")
def outage_database() -> Iterator[str]:
    from pikku_celery.store.migrate import upgrade

    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_cut") as url:
        upgrade(url)
        yield url


@pytest.fixture
def proxy(outage_database: str) -> Iterator[TcpProxy]:
    target = sa.make_url(outage_database)
    line = TcpProxy(target.host or "127.0.0.1", target.port or 5432)
    yield line
    line.close()
