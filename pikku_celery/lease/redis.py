"""Leases in Redis, judged on the Redis server's clock.

Each operation is one Lua script (``EVALSHA``), so it is atomic and one round
trip. Two keys per lease key, sharing the hash tag ``{<namespace>}`` so they
live in one cluster slot:

- ``{ns}:lease:<key>``: a hash ``holder``, ``token``, ``exp`` (epoch ms on the
  Redis clock) that expires by itself (``PEXPIREAT exp``);
- ``{ns}:lease-token:<key>``: the last token granted. It has no expiry and
  outlives release, so the next holder always gets a higher token. (Under an
  ``allkeys-*`` eviction policy Redis could evict it; use ``noeviction`` or a
  ``volatile-*`` policy, which only evicts keys with an expiry.)
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from redis.exceptions import NoScriptError

from .base import TTL, Lease, ttl_millis

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Redis < 5 must be told to replicate a script's effects (it reads TIME before
# writing); from Redis 7 the call is a no-op kept for compatibility.
_NOW = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: lease, token counter. ARGV: holder, ttl_ms. -> {token, exp} or nil.
_ACQUIRE = (
    _NOW
    + """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'exp')
local token
if cur[1] and tonumber(cur[3]) > now then
  if cur[1] ~= ARGV[1] then return false end
  token = tonumber(cur[2])
else
  token = redis.call('INCR', KEYS[2])
end
local exp = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp)
return {token, exp}
"""
)

# KEYS: lease. ARGV: holder, token, ttl_ms. -> exp or nil.
_REFRESH = (
    _NOW
    + """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'exp')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] or tonumber(cur[3]) <= now then
  return false
end
local exp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'exp', exp)
redis.call('PEXPIREAT', KEYS[1], exp)
return exp
"""
)

# KEYS: lease. ARGV: holder, token. The token counter stays.
_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease. -> {holder, token, exp} or nil. The hash may outlive its expiry
# by a moment (Redis expires lazily), so the clock decides, not its presence.
_GET = (
    _NOW
    + """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'exp')
if not cur[1] or tonumber(cur[3]) <= now then return false end
return cur
"""
)


class _Script:
    """A Lua script run by ``EVALSHA``, loaded again if the server forgot it.

    (redis-py's ``Script`` does the same with a little more work per call.)
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def __call__(self, numkeys: int, *keys_and_args: str | int) -> Any:
        try:
            return self.client.evalsha(self.sha, numkeys, *keys_and_args)
        except NoScriptError:
            self.sha = self.client.script_load(self.source)
            return self.client.evalsha(self.sha, numkeys, *keys_and_args)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class RedisLeaseService:
    """Leases in Redis (standalone or cluster), one Lua script per operation.

    ``client`` is a ``redis.Redis`` or ``redis.RedisCluster``; it may or may
    not decode responses.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, namespace: str = "pikku") -> None:
        if "{" in namespace or "}" in namespace:
            raise ValueError("the lease namespace must not contain '{' or '}'")
        self._client = client
        self._prefix = "{" + namespace + "}:lease:"
        self._token_prefix = "{" + namespace + "}:lease-token:"
        self._acquire = _Script(client, _ACQUIRE)
        self._refresh = _Script(client, _REFRESH)
        self._release = _Script(client, _RELEASE)
        self._get = _Script(client, _GET)

    def lease_key(self, key: str) -> str:
        """The Redis key holding the live lease on ``key``."""
        return self._prefix + key

    def token_key(self, key: str) -> str:
        """The Redis key holding the last token granted for ``key``."""
        return self._token_prefix + key

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder`` unless another holder's lease is live."""
        ms = ttl_millis(ttl)
        res = self._acquire(2, self._prefix + key, self._token_prefix + key, holder, ms)
        if res is None:
            return None
        return Lease(key, holder, int(res[0]), _to_datetime(int(res[1])))

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend ``lease`` if it is still live and still this holder's and token's."""
        ms = ttl_millis(ttl)
        res = self._refresh(1, self._prefix + lease.key, lease.holder, lease.token, ms)
        if res is None:
            return None
        return Lease(lease.key, lease.holder, lease.token, _to_datetime(int(res)))

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still its current lease; the token stays."""
        self._release(1, self._prefix + lease.key, lease.holder, lease.token)

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, judged on the Redis clock."""
        res = self._get(1, self._prefix + key)
        if res is None:
            return None
        holder, token, exp = res
        return Lease(key, _text(holder), int(token), _to_datetime(int(exp)))
