"""The lease contract, checked the same way on every backend.

Each point of issue 2 ("Must show" 1) is one test below, run on memory,
SQLite, PostgreSQL, MariaDB and Redis (plus the MySQL no-RETURNING path on
MariaDB and SQLite) and, but for ``hold_lease``, on PostgreSQL through
PgBouncer in transaction pooling. Nothing waits by sleeping a fixed time: tests poll with
a deadline, and ttls are short (0.2-1 s) so lapses come quickly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from pikku_celery.errors import LeaseLostError, LeaseTakenError
from pikku_celery.lease import Lease, LeaseService, SQLLeaseService, hold_lease
from tests.helpers import wait_until
from tests.lease.conftest import (
    BACKENDS,
    EXTRA_PATHS,
    POOLED,
    Backend,
    FlakyService,
    make_backend,
    new_key,
)
from tests.lease.tcp_proxy import TcpProxy

# All stores run on this host, so their clocks agree with ours to well
# within this (the clock-skew tests cover a wrong process clock).
CLOCK_SLACK = timedelta(seconds=1)


@pytest.fixture(params=[*BACKENDS, *EXTRA_PATHS, POOLED])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each lease backend (and code path) in turn, fresh for the test, and
    PostgreSQL's through PgBouncer. (``hold_lease``'s tests keep conftest's
    backends: the path through PgBouncer changes nothing ``hold_lease`` adds
    to the four operations checked here.)"""
    b = make_backend(request.param, request)
    yield b
    b.close()


def assert_expires_in(lease: Lease, ttl: float) -> None:
    assert lease.expires_at.tzinfo is not None
    assert lease.expires_at.utcoffset() == timedelta(0)
    expected = datetime.now(UTC) + timedelta(seconds=ttl)
    assert expected - CLOCK_SLACK <= lease.expires_at <= expected + CLOCK_SLACK


def wait_lapsed(svc: LeaseService, key: str, timeout: float = 5.0) -> None:
    wait_until(lambda: svc.get(key) is None, timeout)


# --- acquire / refresh / release / get ----------------------------------------


def test_one_holder_at_a_time(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    assert svc.get(key) is None

    first = svc.acquire(key, "A", 5.0)
    assert first is not None
    assert (first.key, first.holder, first.token) == (key, "A", 1)
    assert_expires_in(first, 5.0)

    assert svc.acquire(key, "B", 5.0) is None
    assert svc.get(key) == first


def test_keys_are_independent(backend: Backend) -> None:
    svc, k1, k2 = backend.service, new_key(), new_key()
    a = svc.acquire(k1, "A", 5.0)
    b = svc.acquire(k2, "B", 5.0)
    assert a is not None and b is not None
    assert (a.token, b.token) == (1, 1)
    assert svc.get(k1) == a and svc.get(k2) == b

    # Keys and holders compare byte for byte on every store (MySQL's
    # default collation would make "Job" and "job" one key).
    upper = new_key("Job")
    lower = upper.lower()
    assert svc.acquire(upper, "w1", 5.0) is not None
    assert svc.acquire(lower, "w2", 5.0) is not None
    assert svc.acquire(upper, "W1", 5.0) is None


def test_same_holder_reacquire_keeps_token_and_extends(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    first = svc.acquire(key, "A", 1.0)
    assert first is not None
    again = svc.acquire(key, "A", timedelta(seconds=5))
    assert again is not None
    assert again.token == first.token == 1
    assert again.expires_at > first.expires_at
    assert_expires_in(again, 5.0)
    assert svc.get(key) == again


def test_lapsed_lease_passes_on_and_old_lease_is_dead(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    old = svc.acquire(key, "A", 0.1)
    assert old is not None
    wait_lapsed(svc, key)

    new = svc.acquire(key, "B", 5.0)
    assert new is not None and new.token == old.token + 1

    assert svc.refresh(old, 5.0) is None
    svc.release(old)
    assert svc.get(key) == new


def test_grant_after_lapse_is_a_new_token_even_for_the_same_holder(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    old = svc.acquire(key, "A", 0.1)
    assert old is not None
    wait_lapsed(svc, key)
    assert svc.refresh(old, 5.0) is None
    new = svc.acquire(key, "A", 5.0)
    assert new is not None and new.token == 2
    assert svc.refresh(old, 5.0) is None  # the old grant stays dead


def test_release_frees_the_key_and_next_holder_gets_next_token(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    first = svc.acquire(key, "A", 5.0)
    assert first is not None
    svc.release(first)
    assert svc.get(key) is None
    assert svc.refresh(first, 5.0) is None

    second = svc.acquire(key, "B", 5.0)
    assert second is not None and second.token == 2
    svc.release(first)  # stale: must not free its successor
    assert svc.get(key) == second

    svc.release(second)
    third = svc.acquire(key, "A", 5.0)
    assert third is not None and third.token == 3  # tokens never go down


def test_refresh_extends(backend: Backend) -> None:
    svc, key = backend.service, new_key()
    start = time.monotonic()
    lease = svc.acquire(key, "A", 0.1)
    assert lease is not None
    refreshed = svc.refresh(lease, 5.0)
    assert refreshed is not None
    assert (refreshed.holder, refreshed.token) == ("A", lease.token)
    assert refreshed.expires_at > lease.expires_at
    assert_expires_in(refreshed, 5.0)

    # Well past the first ttl, the lease is still live.
    wait_until(lambda: time.monotonic() - start > 0.25)
    assert svc.get(key) == refreshed

    # Only the same holder and token may refresh.
    assert svc.refresh(Lease(key, "B", lease.token, lease.expires_at), 5.0) is None
    assert svc.refresh(Lease(key, "A", lease.token + 1, lease.expires_at), 5.0) is None
    assert svc.get(key) == refreshed


@pytest.mark.parametrize("start", ["fresh key", "lapsed lease"])
def test_concurrent_acquirers_exactly_one_wins(backend: Backend, start: str) -> None:
    key, n = new_key(), 20
    expected_token = 1
    if start == "lapsed lease":
        assert backend.service.acquire(key, "old", 0.1) is not None
        wait_lapsed(backend.service, key)
        expected_token = 2

    peers = [backend.peer() for _ in range(n)]
    for peer in peers:  # connect now, so the race is between statements
        peer.get(new_key("warmup"))
    barrier = threading.Barrier(n)
    results: list[Lease | None] = [None] * n
    errors: list[BaseException] = []

    def contend(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = peers[i].acquire(key, f"worker-{i}", 30.0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, winners
    assert winners[0].token == expected_token
    assert backend.service.get(key) == winners[0]


# --- hold_lease ------------------------------------------------------------------


def test_hold_lease_completes_and_frees_the_key(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    with hold_lease(svc, key, 1.0, holder="A") as held:
        assert held.lease.holder == "A" and held.lease.token == 1
        assert svc.get(key) == held.lease
        assert svc.acquire(key, "B", 1.0) is None
    assert not held.lost.is_set()
    assert svc.get(key) is None
    nxt = svc.acquire(key, "B", 1.0)
    assert nxt is not None and nxt.token == 2


def test_hold_lease_refuses_a_taken_key(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    other = svc.acquire(key, "B", 5.0)
    ran = False
    with pytest.raises(LeaseTakenError) as info, hold_lease(svc, key, 1.0, holder="A"):
        ran = True
    assert not ran
    assert info.value.key == key
    assert svc.get(key) == other


def test_hold_lease_frees_the_key_when_the_body_raises(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    boom = ValueError("boom")
    with pytest.raises(ValueError) as info, hold_lease(svc, key, 1.0, holder="A"):
        raise boom
    assert info.value is boom  # the body's own exception, unchanged
    assert svc.get(key) is None


def test_hold_lease_body_outliving_its_lease_raises_and_new_holder_keeps_it(
    hold_backend: Backend,
) -> None:
    svc, key = hold_backend.service, new_key()
    flaky = FlakyService(svc)
    taken: list[Lease] = []
    with pytest.raises(LeaseLostError), hold_lease(flaky, key, 0.3, holder="A") as held:
        flaky.stall()  # the renewer cannot run: the body outlives the lease
        got = wait_until(lambda: svc.acquire(key, "B", 5.0), timeout=5)
        assert got is not None
        taken.append(got)
        flaky.unstall()
        wait_until(held.lost.is_set, timeout=5)
    assert taken[0].token == held.lease.token + 1
    assert svc.get(key) == taken[0]  # the loser's exit did not release it


def test_hold_lease_sets_lost_while_the_body_runs(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    flaky = FlakyService(svc)
    with pytest.raises(LeaseLostError), hold_lease(flaky, key, 0.3, holder="A") as held:
        flaky.fail_for(60)
        assert wait_until(held.lost.is_set, timeout=5)
        # The body sees it while still running, and can stop early.
        flaky.restore()
    assert held.lost.is_set()


def test_hold_lease_keeps_the_lease_alive_past_its_ttl(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    ttl = 0.15
    start = time.monotonic()
    with hold_lease(svc, key, ttl, holder="A") as held:
        first = held.lease

        def alive_long_enough() -> bool:
            current = svc.get(key)
            assert current is not None and current.token == first.token, current
            return time.monotonic() - start > 4 * ttl

        wait_until(alive_long_enough, timeout=10, interval=0.02)
        assert not held.lost.is_set()
        assert held.lease.expires_at > first.expires_at + timedelta(seconds=2 * ttl)
    assert svc.get(key) is None


def test_hold_lease_survives_an_outage_shorter_than_the_lease(hold_backend: Backend) -> None:
    svc, key = hold_backend.service, new_key()
    flaky = FlakyService(svc)
    ttl = 0.5
    with hold_lease(flaky, key, ttl, holder="A") as held:
        first = held.lease
        # Start the outage right after a renewal: the hardest moment.
        wait_until(lambda: flaky.refresh_ok >= 1, timeout=5)
        flaky.fail_for(0.6 * ttl)
        wait_until(lambda: flaky.refresh_failed >= 1, timeout=5)
        wait_until(lambda: not flaky.down and flaky.refresh_ok_after_outage >= 1, timeout=5)
        assert not held.lost.is_set()
        assert held.lease.token == first.token
    current = svc.acquire(key, "B", 1.0)
    assert current is not None and current.token == first.token + 1


def test_hold_lease_loses_the_lease_on_an_outage_longer_than_the_lease(
    hold_backend: Backend,
) -> None:
    svc, key = hold_backend.service, new_key()
    flaky = FlakyService(svc)
    ttl = 0.4
    entered = time.monotonic()
    with pytest.raises(LeaseLostError), hold_lease(flaky, key, ttl, holder="A") as held:
        flaky.fail_for(60)
        wait_until(held.lost.is_set, timeout=5)
        # Not declared lost before the lease could have expired.
        assert time.monotonic() - entered >= ttl
        flaky.restore()
    # It lapses on the store too: within a lease of the last renewal, which
    # the store dated when it got it (on a loaded machine, after it was sent).
    wait_until(lambda: svc.get(key) is None, timeout=ttl + 2)


# --- a real outage: the connection to PostgreSQL is cut -------------------------


@pytest.fixture(params=["engine", "connection"])
def cut_postgres(
    request: pytest.FixtureRequest, postgres_url: str, _postgres_lease_schema: sa.Engine
) -> Iterator[tuple[TcpProxy, SQLLeaseService]]:
    """A PostgreSQL lease service whose network line the test can cut.

    On an engine, or bound to one connection (which must reconnect by itself,
    in autocommit again).
    """
    url = sa.engine.make_url(postgres_url)
    proxy = TcpProxy(url.host or "127.0.0.1", url.port or 5432)
    engine = sa.create_engine(url.set(host="127.0.0.1", port=proxy.port), pool_size=2)
    conn = engine.connect() if request.param == "connection" else None
    yield proxy, SQLLeaseService(conn if conn is not None else engine)
    if conn is not None:
        assert not conn.invalidated
        assert conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
        conn.close()
    engine.dispose()
    proxy.close()


def test_postgres_real_outage_shorter_than_the_lease_is_survived(
    cut_postgres: tuple[TcpProxy, SQLLeaseService],
) -> None:
    proxy, svc = cut_postgres
    key = new_key()
    watcher = FlakyService(svc)  # only counts renewals; never fails
    with hold_lease(watcher, key, 1.0, holder="A") as held:
        wait_until(lambda: watcher.refresh_ok >= 1, timeout=5)
        proxy.cut()
        cut_at = time.monotonic()
        wait_until(lambda: time.monotonic() - cut_at > 0.4, interval=0.02)
        renewed = watcher.refresh_ok
        proxy.restore()
        wait_until(lambda: watcher.refresh_ok > renewed, timeout=5)
        assert not held.lost.is_set()
    assert svc.get(key) is None
    assert svc.acquire(key, "B", 1.0) is not None  # the line works again


def test_postgres_real_outage_longer_than_the_lease_loses_it(
    cut_postgres: tuple[TcpProxy, SQLLeaseService], postgres_engine: sa.Engine
) -> None:
    proxy, svc = cut_postgres
    key = new_key()
    direct = SQLLeaseService(postgres_engine)
    with pytest.raises(LeaseLostError), hold_lease(svc, key, 0.4, holder="A") as held:
        proxy.cut()
        wait_until(held.lost.is_set, timeout=5)
        # The holder gives up on its own (monotonic) deadline, which falls a
        # little before the database's expiry: the new holder polls.
        taken = wait_until(lambda: direct.acquire(key, "B", 5.0), timeout=5)
        assert taken is not None and taken.token == held.lease.token + 1
        proxy.restore()
    assert direct.get(key) == taken
    assert svc.get(key) == taken  # reconnected after the outage
