"""A worker whose clock is an hour off can neither take a live lease nor stretch its own.

PostgreSQL, MariaDB and Redis judge leases on their own clock; the worker's
clock is patched in-process (``time.time``, ``time.time_ns`` and ``datetime``
in the lease modules). The in-memory service, which by design uses the process
clock, is the control: the same patch fools it, so the patch really bites.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, tzinfo

import pytest

from pikku_celery.errors import LeaseTakenError
from pikku_celery.lease import InMemoryLeaseService, LeaseService, hold_lease
from pikku_celery.lease import hold as lease_hold
from pikku_celery.lease import memory as lease_memory
from pikku_celery.lease import redis as lease_redis
from pikku_celery.lease import sql as lease_sql
from pikku_celery.ports import lease as lease_base
from tests.helpers import wait_until
from tests.lease.conftest import SERVER_CLOCK, Backend, make_backend, new_key

HOUR = 3600.0
_real_time = time.time


def real_now() -> datetime:
    """The true wall clock, whatever the patch says."""
    return datetime.fromtimestamp(_real_time(), UTC)


@pytest.fixture(params=SERVER_CLOCK)
def server_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    b = make_backend(request.param, request)
    yield b
    b.close()


@pytest.fixture(params=[+HOUR, -HOUR], ids=["hour-fast", "hour-slow"])
def skew(request: pytest.FixtureRequest) -> float:
    return float(request.param)


@pytest.fixture
def skewed_clock(monkeypatch: pytest.MonkeyPatch, skew: float) -> Callable[[], None]:
    """Returns a function that sets this process's clock ``skew`` seconds off."""

    def apply() -> None:
        real_time, real_time_ns = time.time, time.time_ns
        monkeypatch.setattr(time, "time", lambda: real_time() + skew)
        monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(skew * 1e9))

        class SkewedDatetime(datetime):
            @classmethod
            def now(cls, tz: tzinfo | None = None) -> SkewedDatetime:
                t = datetime.fromtimestamp(real_time() + skew, tz)
                return cls.combine(t.date(), t.timetz())

            @classmethod
            def utcnow(cls) -> SkewedDatetime:
                return cls.now(UTC).replace(tzinfo=None)

        for mod in (lease_base, lease_hold, lease_memory, lease_sql, lease_redis):
            if hasattr(mod, "datetime"):
                monkeypatch.setattr(mod, "datetime", SkewedDatetime)
        assert abs(time.time() - real_time() - skew) < 5
        assert abs(time.time_ns() / 1e9 - real_time() - skew) < 5

    return apply


def test_skewed_worker_cannot_take_a_live_lease(
    server_backend: Backend, skewed_clock: Callable[[], None]
) -> None:
    key = new_key()
    honest = server_backend.service.acquire(key, "honest", 2.0)
    assert honest is not None

    skewed_clock()
    worker: LeaseService = server_backend.peer()
    assert worker.acquire(key, "skewed", 2.0) is None
    assert worker.get(key) == honest  # still live, whatever our clock says
    with pytest.raises(LeaseTakenError), hold_lease(worker, key, 2.0, holder="skewed"):
        pass
    assert server_backend.service.get(key) == honest


def test_skewed_worker_cannot_make_its_lease_outlive_its_ttl(
    server_backend: Backend, skewed_clock: Callable[[], None]
) -> None:
    key, ttl = new_key(), 0.3
    skewed_clock()
    worker = server_backend.peer()
    start = time.monotonic()
    lease = worker.acquire(key, "skewed", ttl)
    assert lease is not None
    # The expiry is the store's now + ttl, not the worker's (an hour off).
    expected = real_now() + timedelta(seconds=ttl)
    assert abs((lease.expires_at - expected).total_seconds()) < 1.0

    # Once the ttl has passed on the store's clock, the lease is gone: another
    # worker takes it, and the skewed worker can neither refresh nor re-take
    # its old grant.
    other = server_backend.service
    taken = wait_until(lambda: other.acquire(key, "honest", 5.0), timeout=5)
    assert time.monotonic() - start < ttl + 2.0
    assert taken is not None and taken.token == lease.token + 1
    assert worker.refresh(lease, 3600.0) is None
    assert worker.acquire(key, "skewed", 3600.0) is None
    assert other.get(key) == taken


def test_skewed_worker_holds_normally(
    server_backend: Backend, skewed_clock: Callable[[], None]
) -> None:
    """A skewed clock does not make a held lease look lost either."""
    skewed_clock()
    worker, key = server_backend.peer(), new_key()
    with hold_lease(worker, key, 0.2, holder="skewed") as held:
        wait_until(lambda: held.lease.expires_at > real_now() + timedelta(seconds=0.1))
        first = held.lease
        wait_until(lambda: held.lease.expires_at > first.expires_at + timedelta(seconds=0.3))
    assert not held.lost.is_set()
    assert worker.get(key) is None


def test_control_the_process_clock_backend_is_fooled(
    skewed_clock: Callable[[], None], skew: float
) -> None:
    """The in-memory service trusts the process clock: the same patch fools it.

    (A lease granted before the clock jumps stands for one granted by a worker
    with a correct clock.) This is why shared stores judge on their own clock.
    """
    svc, key = InMemoryLeaseService(), new_key()
    ttl = 600.0 if skew > 0 else 0.2
    start = time.monotonic()
    lease = svc.acquire(key, "honest", ttl)
    assert lease is not None
    skewed_clock()
    if skew > 0:
        # An hour fast: a live 10-minute lease looks long lapsed and is taken.
        assert svc.acquire(key, "skewed", 600.0) is not None
    else:
        # An hour slow: a 0.2 s lease is still "live" well after its ttl.
        wait_until(lambda: time.monotonic() - start > 3 * ttl)
        assert svc.get(key) == lease
