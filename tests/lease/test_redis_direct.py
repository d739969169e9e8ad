"""The Redis lease service on a connection of its own, with commands packed by hand.

The conformance suite runs every rule through this path; these tests cover
what is particular to it: the connection it keeps (and gives back), the
client's path when that connection is busy or unsuitable, connection loss
and retries that must not apply an acquire twice, NOSCRIPT, and fork.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from pikku_celery.lease import RedisLeaseService
from tests.lease.conftest import exercise, new_key
from tests.lease.tcp_proxy import TcpProxy
from tests.services import REDIS_URL


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(REDIS_URL)
    yield c
    c.close()


@pytest.fixture
def used(client: redis.Redis, redis_namespace: str) -> RedisLeaseService:
    """A service that has taken its own connection (every operation ran once)."""
    svc = RedisLeaseService(client, namespace=redis_namespace)
    exercise(svc)
    return svc


def test_the_service_keeps_one_connection_and_gives_it_back(
    client: redis.Redis, redis_namespace: str
) -> None:
    pool = client.connection_pool
    svc = RedisLeaseService(client, namespace=redis_namespace)
    assert svc.line is not None and svc.line.conn is None  # nothing until used
    exercise(svc)
    own = svc.line.conn
    assert own is not None and own in pool._in_use_connections
    exercise(svc)
    assert svc.line.conn is own  # the same one every time
    svc.close()
    assert svc.line.conn is None and own not in pool._in_use_connections
    exercise(svc)  # takes one again
    conn = svc.line.conn
    del svc
    assert conn not in pool._in_use_connections  # given back when collected


def test_a_busy_connection_sends_the_call_through_the_client(used: RedisLeaseService) -> None:
    svc = used
    assert svc.line is not None
    with svc.line.lock:  # another thread is using it
        exercise(svc)


def test_threads_sharing_a_service(client: redis.Redis, redis_namespace: str) -> None:
    svc = RedisLeaseService(client, namespace=redis_namespace)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(30):
                exercise(svc)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors


@pytest.mark.parametrize(
    "options",
    [{"decode_responses": True}, {"protocol": 3}, {"protocol": 3, "decode_responses": True}],
    ids=["decoded", "resp3", "resp3-decoded"],
)
def test_client_options(redis_client: redis.Redis, redis_namespace: str, options: Any) -> None:
    c = redis.Redis.from_url(REDIS_URL, **options)
    try:
        svc = RedisLeaseService(c, namespace=redis_namespace)
        exercise(svc)
        assert svc.line is not None and svc.line.conn is not None
    finally:
        c.close()


def test_a_blocking_pool_keeps_its_connections(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    pool = redis.BlockingConnectionPool.from_url(REDIS_URL, max_connections=1, timeout=1)
    c = redis.Redis(connection_pool=pool)
    try:
        svc = RedisLeaseService(c, namespace=redis_namespace)
        assert svc.line is None
        exercise(svc)
        assert c.ping()  # the pool's only connection is free
    finally:
        c.close()
        pool.disconnect()


def test_a_forgotten_script_is_loaded_again(client: redis.Redis, redis_namespace: str) -> None:
    svc = RedisLeaseService(client, namespace=redis_namespace)
    key = new_key()
    lease = svc.acquire(key, "A", 5.0)
    assert lease is not None
    for script in (svc._acquire, svc._refresh, svc._release, svc._get):
        script.sha = "0" * 40
    assert svc.acquire(key, "A", 5.0) == svc.get(key)
    refreshed = svc.refresh(lease, 5.0)
    assert refreshed is not None
    svc.release(refreshed)
    assert svc.get(key) is None
    assert svc._acquire.sha != "0" * 40


def test_a_lost_reply_retried_does_not_grant_twice(
    redis_client: redis.Redis, redis_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acquire ran, its reply was lost with the connection; the retry keeps the token."""
    c = redis.Redis.from_url(REDIS_URL, retry=Retry(NoBackoff(), 3))
    try:
        svc = RedisLeaseService(c, namespace=redis_namespace)
        exercise(svc)
        assert svc.line is not None
        conn = svc.line.conn
        real = conn.read_response
        lost = []

        def read_response(*args: Any, **kwargs: Any) -> Any:
            if not lost:
                lost.append(real(*args, **kwargs))  # the server did it...
                conn.disconnect()
                raise RedisConnectionError("reply lost")  # ...but we never hear
            return real(*args, **kwargs)

        monkeypatch.setattr(conn, "read_response", read_response)
        key = new_key()
        lease = svc.acquire(key, "A", 5.0)
        assert lost and lease is not None and lease.token == 1
        assert c.get(svc.token_key(key)) == b"1"
        assert svc.get(key) == lease
    finally:
        c.close()


@pytest.mark.parametrize("retries", [0, 3])
def test_a_killed_connection_reconnects(
    redis_client: redis.Redis, redis_namespace: str, retries: int
) -> None:
    """As the client does: with retries the call goes through, without it fails once."""
    c = redis.Redis.from_url(REDIS_URL, retry=Retry(NoBackoff(), retries))
    try:
        svc = RedisLeaseService(c, namespace=redis_namespace)
        key = new_key()
        lease = svc.acquire(key, "A", 30.0)
        assert lease is not None and svc.line is not None
        own = svc.line.conn
        own.send_command("CLIENT", "ID")
        assert c.client_kill_filter(_id=own.read_response()) == 1
        if retries == 0:
            with pytest.raises(RedisConnectionError):
                svc.refresh(lease, 30.0)
        refreshed = svc.refresh(lease, 30.0)
        assert refreshed is not None and refreshed.token == lease.token
        assert svc.line.conn is own  # the same connection, reconnected
        exercise(svc)
    finally:
        c.close()


def test_a_real_outage_fails_calls_and_the_line_comes_back(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    url = redis.connection.parse_url(REDIS_URL)
    proxy = TcpProxy(url.get("host", "127.0.0.1"), int(url.get("port", 6379)))
    c = redis.Redis(host="127.0.0.1", port=proxy.port, db=url.get("db", 0), socket_timeout=2)
    try:
        svc = RedisLeaseService(c, namespace=redis_namespace)
        key = new_key()
        lease = svc.acquire(key, "A", 30.0)
        assert lease is not None
        proxy.cut()
        with pytest.raises((RedisConnectionError, redis.exceptions.TimeoutError)):
            svc.refresh(lease, 30.0)
        proxy.restore()
        refreshed = svc.refresh(lease, 30.0)
        assert refreshed is not None and refreshed.token == lease.token
        exercise(svc)
    finally:
        c.close()
        proxy.close()


def test_a_forked_child_uses_a_connection_of_its_own(used: RedisLeaseService) -> None:
    svc = used
    assert svc.line is not None
    parent_conn = svc.line.conn
    pid = os.fork()
    if pid == 0:  # the child: report by exit code only
        code = 1
        try:
            if svc.line.conn is None:
                exercise(svc)
                code = 0 if svc.line.conn is not parent_conn else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert svc.line.conn is parent_conn
    exercise(svc)  # the parent's line is unharmed
