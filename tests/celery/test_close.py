"""``Pikku.close()``: every connection and thread pikku opened is let go.

Checked from outside: the server's own list of sessions (PostgreSQL's
``pg_stat_activity``, Redis's ``CLIENT LIST``), found by the application
name this test gives its connections, and the process's threads.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from pikku_celery import Context, Pikku
from pikku_celery.lease import RedisLeaseService
from pikku_celery.store.migrate import upgrade
from tests.helpers import wait_until
from tests.services import (
    PG_ADMIN_URL,
    REDIS_URL,
    SUITE_APP_NAME,
    scratch_database,
    terminate_backend,
    unavailable,
)

CLOSED_BROKER = "amqp://guest:guest@127.0.0.1:1//"


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with scratch_database(PG_ADMIN_URL, f"pikku_close_{uuid.uuid4().hex[:8]}") as url:
        upgrade(url)
        yield url


def own(name: str) -> str:
    """An application_name of this session's own (terminate_backend kills only those)."""
    return f"{SUITE_APP_NAME}:{name}"


def eager_pikku(url: str, name: str, **options: object) -> Pikku:
    app = Celery("closing", set_as_current=False)
    app.conf.update(broker_url=CLOSED_BROKER, broker_connection_retry=False, task_always_eager=True)
    tagged = sa.make_url(url).update_query_dict({"application_name": own(name)})
    pikku = Pikku(app, tagged.render_as_string(hide_password=False), install_beat=False, **options)

    @app.task(name="closing.double", shared=False)
    def double(n: int) -> int:
        return 2 * n

    @pikku.workflow(name="closing.flow")
    def flow(ctx: Context, n: int) -> int:
        return int(ctx.step("double", double, n))

    return pikku


def sessions(name: str) -> int:
    admin = sa.create_engine(PG_ADMIN_URL, poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            found = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                {"n": own(name)},
            )
            return int(found.scalar_one())
    finally:
        admin.dispose()


def gone(name: str) -> bool:
    """No session of ``name`` is left (a closed session's server process
    leaves the list a moment after the client hangs up)."""
    wait_until(lambda: sessions(name) == 0, timeout=10)
    return True


def settle_threads() -> set[threading.Thread]:
    """The live settle listener threads of this process (earlier tests' stores
    that were never closed may have some: compare with a set taken before)."""
    return {t for t in threading.enumerate() if t.name == "pikku-settle" and t.is_alive()}


def test_close_leaves_no_session_and_no_listener_thread(pg_url: str) -> None:
    name = f"pikku-close-{uuid.uuid4().hex[:8]}"
    before = settle_threads()
    pikku = eager_pikku(pg_url, name)
    assert pikku.start("closing.flow", 21).wait(timeout=30) == 42
    lease = pikku.leases.acquire("closing-key", "me", 30)
    assert lease is not None
    assert sessions(name) >= 2  # the pool's and wait()'s LISTEN connection
    assert settle_threads() - before

    pikku.close()

    assert settle_threads() - before == set()
    assert gone(name)
    pikku.close()  # idempotent
    assert sessions(name) == 0


def test_a_closed_pikku_opens_again_when_used_and_with_closes_it(pg_url: str) -> None:
    name = f"pikku-reuse-{uuid.uuid4().hex[:8]}"
    before = settle_threads()
    pikku = eager_pikku(pg_url, name)
    pikku.close()
    with pikku as same:
        assert same is pikku
        assert pikku.start("closing.flow", 5).wait(timeout=30) == 10
        assert sessions(name) >= 2
    assert settle_threads() - before == set()
    assert gone(name)


def test_close_wakes_a_waiter_which_still_gets_its_output(pg_url: str) -> None:
    name = f"pikku-waiter-{uuid.uuid4().hex[:8]}"
    before = settle_threads()
    pikku = eager_pikku(pg_url, name)

    @pikku.workflow(name="closing.approval")
    def approval(ctx: Context) -> object:
        return ctx.wait_for_signal("approve")

    run = approval.start()
    outcome: list[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(run.wait(timeout=30)))
    waiter.start()
    try:
        pikku.close()  # while wait() may be listening
        run.signal("approve", "yes")
    finally:
        waiter.join(40)
    assert outcome == ["yes"]
    pikku.close()  # the listener the waiter started again is stopped too
    assert settle_threads() - before == set()


@pytest.fixture
def redis_name() -> Iterator[str]:
    name = f"pikku-close-{uuid.uuid4().hex[:8]}"
    probe = redis.Redis.from_url(REDIS_URL)
    try:
        probe.ping()
    except redis.RedisError as exc:
        unavailable("redis", exc)
    yield name
    probe.close()


def redis_clients(name: str) -> int:
    probe = redis.Redis.from_url(REDIS_URL)
    try:
        return sum(1 for c in probe.client_list() if c.get("name") == name)
    finally:
        probe.close()


def test_close_closes_the_redis_lease_clients_connections(pg_url: str, redis_name: str) -> None:
    client = redis.Redis.from_url(REDIS_URL, client_name=redis_name)
    leases = RedisLeaseService(client, namespace=f"close-{uuid.uuid4().hex[:8]}")
    pikku = eager_pikku(pg_url, redis_name, lease_service=leases)
    assert pikku.start("closing.flow", 1).wait(timeout=30) == 2
    assert leases.acquire("k", "me", 30) is not None
    assert redis_clients(redis_name) >= 1

    pikku.close()

    assert redis_clients(redis_name) == 0
    assert gone(redis_name)
    assert leases.get("k") is not None  # usable again: it reconnects
    pikku.close()
    assert redis_clients(redis_name) == 0


def listening(name: str) -> set[int]:
    """Server pids of the LISTEN sessions of ``name``."""
    admin = sa.create_engine(PG_ADMIN_URL, poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            found = conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = :n "
                    "AND query LIKE 'LISTEN%'"
                ),
                {"n": own(name)},
            )
            return {int(pid) for (pid,) in found}
    finally:
        admin.dispose()


def test_the_listener_listens_again_after_its_connection_is_killed(pg_url: str) -> None:
    name = f"pikku-relisten-{uuid.uuid4().hex[:8]}"
    pikku = eager_pikku(pg_url, name)
    try:
        assert pikku.start("closing.flow", 1).wait(timeout=30) == 2
        [first] = wait_until(lambda: listening(name))
        terminate_backend(sa.create_engine(PG_ADMIN_URL, poolclass=sa.pool.NullPool), first)
        again = wait_until(lambda: listening(name) - {first}, timeout=30)
        assert len(again) == 1 and first not in listening(name)
        assert pikku.start("closing.flow", 4).wait(timeout=30) == 8
    finally:
        pikku.close()
    assert gone(name)


def test_a_pikku_that_disconnected_its_signals_no_longer_hears_a_worker_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from celery import signals

    nowhere = tmp_path / "missing" / "dir" / "s.db"
    pikku = Pikku(Celery("dropped", broker="memory://"), f"sqlite:///{nowhere}")

    def heard() -> bool:  # other tests' Pikkus may hear the signal too
        return any(str(nowhere) in r.getMessage() for r in caplog.records)

    try:
        signals.worker_ready.send(sender=None)  # no database: the worker says so
        assert heard()
        caplog.clear()
        pikku.disconnect_signals()
        signals.worker_ready.send(sender=None)
        assert not heard()
    finally:
        pikku.disconnect_signals()
        pikku.close()
