"""How the Redis lease service lays out its keys."""

from __future__ import annotations

import redis
from redis.crc import key_slot

from pikku_celery.lease import RedisLeaseService
from tests.lease.conftest import new_key
from tests.services import REDIS_URL


def test_keys_share_a_slot_lease_expires_and_token_outlives_release(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    svc = RedisLeaseService(redis_client, namespace=redis_namespace)
    key = new_key("job{with}braces")
    lease = svc.acquire(key, "A", 5.0)
    assert lease is not None
    lease_key, token_key = svc.lease_key(key), svc.token_key(key)
    assert key_slot(lease_key.encode()) == key_slot(token_key.encode())

    assert 0 < redis_client.pttl(lease_key) <= 5000  # expires by itself
    assert redis_client.pttl(token_key) == -1  # never expires
    svc.release(lease)
    assert redis_client.exists(lease_key) == 0
    assert redis_client.get(token_key) == b"1"
    again = svc.acquire(key, "B", 5.0)
    assert again is not None and again.token == 2


def test_a_client_that_decodes_responses_works_too(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        svc = RedisLeaseService(client, namespace=redis_namespace)
        key = new_key()
        lease = svc.acquire(key, "A", 5.0)
        assert lease is not None and lease.token == 1
        assert svc.get(key) == lease
        refreshed = svc.refresh(lease, 5.0)
        assert refreshed is not None
        svc.release(refreshed)
        assert svc.get(key) is None
    finally:
        client.close()


def test_a_script_the_server_does_not_know_is_loaded_again(
    redis_client: redis.Redis, redis_namespace: str
) -> None:
    """E.g. after a failover to a replica that never saw the scripts.

    (Not SCRIPT FLUSH: that would pull the scripts from under other users of
    the server.)
    """
    svc = RedisLeaseService(redis_client, namespace=redis_namespace)
    key = new_key()
    assert svc.acquire(key, "A", 5.0) is not None
    script = svc._get
    script.sha = "0" * 40
    assert svc.get(key) is not None
    assert script.sha != "0" * 40
