"""A lease service inside one process: for tests and single-process use."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from ..ports.lease import TTL, Lease, ttl_millis


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass
class _Entry:
    holder: str
    token: int
    expires_ms: int  # 0 when released: the token survives release


class InMemoryLeaseService:
    """Leases judged on this process's clock (or ``clock``, epoch ms); thread-safe."""

    def __init__(self, clock: Callable[[], int] = _now_ms) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._clock_ms = clock

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        ms = ttl_millis(ttl)
        with self._lock:
            now = self._clock_ms()
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(holder, 1, now + ms)
                self._entries[key] = entry
            elif entry.expires_ms > now:
                if entry.holder != holder:
                    return None
                entry.expires_ms = now + ms
            else:
                entry.holder, entry.token, entry.expires_ms = holder, entry.token + 1, now + ms
            return Lease(key, entry.holder, entry.token, _to_dt(entry.expires_ms))

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        ms = ttl_millis(ttl)
        with self._lock:
            now = self._clock_ms()
            entry = self._entries.get(lease.key)
            if (
                entry is None
                or entry.holder != lease.holder
                or entry.token != lease.token
                or entry.expires_ms <= now
            ):
                return None
            entry.expires_ms = now + ms
            return Lease(lease.key, lease.holder, lease.token, _to_dt(entry.expires_ms))

    def release(self, lease: Lease) -> None:
        with self._lock:
            entry = self._entries.get(lease.key)
            if entry and entry.holder == lease.holder and entry.token == lease.token:
                entry.expires_ms = 0

    def lapse(self, key: str) -> None:
        """End the live lease on ``key`` now, keeping its token: what the
        store sees once a dead holder's lease has expired, without waiting
        for it (the next grant is a change of hands, token + 1)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.expires_ms > 1:
                entry.expires_ms = 1

    def get(self, key: str) -> Lease | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.expires_ms <= self._clock_ms():
                return None
            return Lease(key, entry.holder, entry.token, _to_dt(entry.expires_ms))
