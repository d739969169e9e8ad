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

On a ``redis.Redis`` client the service sends its ``EVALSHA`` commands on a
connection of its own, taken from the client's pool on first use, as bytes
packed here. Why: the server answers a lease script quickly, and
``execute_command`` (pool checkout, which polls the socket; argument
encoding; metrics) cost the client about as much again as the whole round
trip; on a connection of its own with pre-packed bytes the client's share is
a fraction of that (``benchmarks/leases.py``). A thread that finds that
connection busy uses the client as before, and so does a ``RedisCluster``
(slot routing, redirections).

Connection errors are retried as the client's ``Retry`` says, on either path.
That is safe for every script: a retried acquire by the same holder keeps its
token (or, if its lease lapsed meanwhile, gets the next one, which nobody
else saw), and refresh and release are guarded by holder and token.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import threading
import weakref
from datetime import UTC, datetime, timedelta
from typing import Any

from ..extras import MissingExtraError

try:
    import redis
    from redis.connection import BlockingConnectionPool, ConnectionPool
    from redis.exceptions import NoScriptError
except ImportError as exc:
    raise MissingExtraError("RedisLeaseService", "redis", exc.name) from None

from ..ports.lease import TTL, Lease, ttl_millis

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
    ``pack`` builds the whole command as RESP bytes, for :class:`Line`.
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, source: str, numkeys: int) -> None:
        self.client = client
        self.source = source
        self.numkeys = numkeys
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    @property
    def sha(self) -> str:
        return self._sha

    @sha.setter
    def sha(self, sha: str) -> None:
        self._sha = sha
        head = [b"EVALSHA", sha.encode(), b"%d" % self.numkeys]
        self._head = b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in head)

    def __call__(self, *keys_and_args: str | int) -> Any:
        try:
            return self.client.evalsha(self.sha, self.numkeys, *keys_and_args)
        except NoScriptError:
            self.load()
            return self.client.evalsha(self.sha, self.numkeys, *keys_and_args)

    def load(self) -> None:
        self.sha = self.client.script_load(self.source)

    def pack(self, args: tuple[str | int, ...], encoding: str, errors: str) -> bytes | None:
        """``EVALSHA sha numkeys keys... args...`` in RESP; None for a value not packed here."""
        out = [b"*%d\r\n" % (len(args) + 3), self._head]
        for arg in args:
            if type(arg) is str:
                b = arg.encode(encoding, errors)
            elif type(arg) is int:
                b = b"%d" % arg
            else:
                return None
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)


# redis-py 5.0 wants a command name for a pool checkout; later versions warn if given one.
_NAME_CHECKOUT = (
    inspect.signature(ConnectionPool.get_connection).parameters["command_name"].default
    is inspect.Parameter.empty
)


class Line:
    """The service's own connection from the client's pool, one caller at a time.

    Taken on first use and kept, so a call skips the pool's checkout (a lock
    and a poll of the socket); back to the pool on ``close()`` or when the
    service is collected. A forked child forgets its parent's connection.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.lock = threading.Lock()
        # A redis.connection.AbstractConnection (typed Any: its methods are not annotated).
        self.conn: Any = None
        _LINES.add(self)

    def call(self, packed: bytes) -> Any:
        """Send ``packed``, return the reply; the caller holds ``lock``."""
        conn = self.conn
        if conn is None:
            pool = self.pool
            conn = pool.get_connection("EVALSHA") if _NAME_CHECKOUT else pool.get_connection()
            self.conn = conn

        def exchange() -> Any:
            conn.send_packed_command((packed,))
            return conn.read_response()

        def failed(_error: Exception) -> None:
            conn.disconnect()  # the next try reconnects

        try:
            return conn.retry.call_with_retry(exchange, failed)
        finally:
            # What the pool does on release: redis-py's maintenance
            # notifications can ask for a new connection (newer versions only).
            should_reconnect = getattr(conn, "should_reconnect", None)
            if should_reconnect is not None and should_reconnect():
                conn.disconnect()

    def close(self) -> None:
        """Give the line's connection back to the pool (the next call takes one anew)."""
        with self.lock:
            conn, self.conn = self.conn, None
        if conn is not None:
            self.pool.release(conn)

    def forget(self) -> None:
        """In a forked child: the connection is the parent's (closing our copy is harmless)."""
        self.conn = None
        self.lock = threading.Lock()


_LINES: weakref.WeakSet[Line] = weakref.WeakSet()


def _forget_lines() -> None:
    for line in list(_LINES):
        line.forget()


os.register_at_fork(after_in_child=_forget_lines)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class RedisLeaseService:
    """Leases in Redis (standalone or cluster), one Lua script per operation.

    ``client`` is a ``redis.Redis`` or ``redis.RedisCluster``; it may or may
    not decode responses. On a ``redis.Redis`` (unless its pool is a
    ``BlockingConnectionPool``, whose connections are counted out) the
    service keeps one connection of the pool for itself; ``close()`` gives
    it back (:attr:`line`).
    """

    def __init__(self, client: redis.Redis | redis.RedisCluster, namespace: str = "pikku") -> None:
        if "{" in namespace or "}" in namespace:
            raise ValueError("the lease namespace must not contain '{' or '}'")
        self._client = client
        self._prefix = "{" + namespace + "}:lease:"
        self._token_prefix = "{" + namespace + "}:lease-token:"
        self._acquire = _Script(client, _ACQUIRE, 2)
        self._refresh = _Script(client, _REFRESH, 1)
        self._release = _Script(client, _RELEASE, 1)
        self._get = _Script(client, _GET, 1)
        self.line: Line | None = None
        """The connection the service keeps for itself (None on a blocking
        pool or a cluster): ``line.conn`` is None until first used and after
        ``close()``; a caller holding ``line.lock`` sends calls through the
        client instead."""
        self._encoding = ("utf-8", "strict")
        if isinstance(client, redis.Redis):
            pool = client.connection_pool
            if not isinstance(pool, BlockingConnectionPool):
                encoder = client.get_encoder()
                self._encoding = (encoder.encoding, encoder.encoding_errors)
                self.line = Line(pool)
                weakref.finalize(self, self.line.close)

    def close(self) -> None:
        """Give the service's own connection back and close the client's idle
        connections (it reconnects if used again; connections in use elsewhere
        are left alone)."""
        if self.line is not None:
            self.line.close()
        if isinstance(self._client, redis.Redis):
            self._client.connection_pool.disconnect(inuse_connections=False)

    def _call(self, script: _Script, *keys_and_args: str | int) -> Any:
        line = self.line
        if line is not None and line.lock.acquire(blocking=False):
            try:
                packed = script.pack(keys_and_args, *self._encoding)
                if packed is not None:
                    try:
                        return line.call(packed)
                    except NoScriptError:
                        script.load()
                        return line.call(script.pack(keys_and_args, *self._encoding) or b"")
            finally:
                line.lock.release()
        return script(*keys_and_args)

    def lease_key(self, key: str) -> str:
        """The Redis key holding the live lease on ``key``."""
        return self._prefix + key

    def token_key(self, key: str) -> str:
        """The Redis key holding the last token granted for ``key``."""
        return self._token_prefix + key

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder`` unless another holder's lease is live."""
        ms = ttl_millis(ttl)
        res = self._call(self._acquire, self._prefix + key, self._token_prefix + key, holder, ms)
        if res is None:
            return None
        return Lease(key, holder, int(res[0]), _to_datetime(int(res[1])))

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend ``lease`` if it is still live and still this holder's and token's."""
        ms = ttl_millis(ttl)
        res = self._call(self._refresh, self._prefix + lease.key, lease.holder, lease.token, ms)
        if res is None:
            return None
        return Lease(lease.key, lease.holder, lease.token, _to_datetime(int(res)))

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still its current lease; the token stays."""
        self._call(self._release, self._prefix + lease.key, lease.holder, lease.token)

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, judged on the Redis clock."""
        res = self._call(self._get, self._prefix + key)
        if res is None:
            return None
        holder, token, exp = res
        return Lease(key, _text(holder), int(token), _to_datetime(int(exp)))
