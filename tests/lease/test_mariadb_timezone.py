"""MariaDB judges leases in UTC whatever the session's ``time_zone``.

``NOW()``, ``UNIX_TIMESTAMP(datetime)`` and friends follow the session time
zone; the lease clock (``UTC_TIMESTAMP(6)`` measured from the epoch as a
DATETIME) must not. Sessions here run at +05:00 and -08:00 beside a UTC one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.lease import SQLLeaseService
from tests.helpers import wait_until
from tests.lease.conftest import new_key

OFFSETS = {"+05:00": 5 * 60, "-08:00": -8 * 60}


@pytest.fixture(params=list(OFFSETS))
def zone(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def zoned_engine(mysql_url: str, zone: str, _mysql_lease_schema: sa.Engine) -> Iterator[sa.Engine]:
    """An engine whose every connection runs in session time zone ``zone``."""
    engine = sa.create_engine(mysql_url, pool_size=2)

    @sa.event.listens_for(engine, "connect")
    def _set_zone(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute(f"SET time_zone = '{zone}'")
        cur.close()

    yield engine
    engine.dispose()


def test_the_session_really_is_off_utc(zoned_engine: sa.Engine, zone: str) -> None:
    with zoned_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT @@session.time_zone").scalar() == zone
        minutes = conn.exec_driver_sql(
            "SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())"
        ).scalar()
        # The trap the lease clock avoids: UNIX_TIMESTAMP(<datetime>) reads
        # its argument in the session zone, so UTC_TIMESTAMP() comes out
        # shifted by the offset.
        shift = conn.exec_driver_sql(
            "SELECT UNIX_TIMESTAMP(UTC_TIMESTAMP()) - UNIX_TIMESTAMP()"
        ).scalar()
    assert minutes == pytest.approx(OFFSETS[zone], abs=1)
    assert shift == pytest.approx(-OFFSETS[zone] * 60, abs=2)


@pytest.mark.parametrize("use_returning", [None, False], ids=["returning", "read-back"])
def test_leases_are_judged_in_utc(
    zoned_engine: sa.Engine, mysql_engine: sa.Engine, use_returning: bool | None
) -> None:
    zoned = SQLLeaseService(zoned_engine, use_returning=use_returning)
    utc = SQLLeaseService(mysql_engine, use_returning=use_returning)
    key, ttl = new_key(), 0.25

    start = time.monotonic()
    lease = zoned.acquire(key, "zoned", ttl)
    assert lease is not None and lease.token == 1
    expected = datetime.now(UTC) + timedelta(seconds=ttl)
    assert abs((lease.expires_at - expected).total_seconds()) < 1.0

    # Both sessions see the same live lease, and neither hands it over early.
    assert utc.get(key) == lease
    assert utc.acquire(key, "utc", ttl) is None
    refreshed = zoned.refresh(lease, ttl)
    assert refreshed is not None
    assert abs((refreshed.expires_at - expected).total_seconds()) < 1.0

    # It lapses after its ttl: not hours early, not hours late.
    taken = wait_until(lambda: utc.acquire(key, "utc", ttl), timeout=5)
    assert time.monotonic() - start >= ttl
    assert taken is not None and taken.token == 2
    assert zoned.get(key) == taken
    assert zoned.acquire(key, "zoned", ttl) is None
    assert zoned.refresh(lease, ttl) is None

    # And the other way round: a lease taken in UTC lapses on time for the
    # zoned session too.
    again = wait_until(lambda: zoned.acquire(key, "zoned", ttl), timeout=5)
    assert again is not None and again.token == 3
