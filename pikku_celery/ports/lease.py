"""The lease port: who may do a piece of work, until when, with a fencing token."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

TTL = float | timedelta


def ttl_seconds(ttl: TTL) -> float:
    """Normalise a ttl and refuse nonsense early, at the caller's boundary."""
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else float(ttl)
    if not seconds > 0:
        raise ValueError(f"lease ttl must be positive, got {ttl!r}")
    return seconds


def positive_seconds(value: Any, name: str) -> float:
    """A lease-length setting as seconds, or a ValueError naming it: zero, a
    negative length or NaN would make every lease look lapsed at once."""
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return seconds


def ttl_millis(ttl: TTL) -> int:
    """Leases are kept with millisecond precision on every backend."""
    return max(1, round(ttl_seconds(ttl) * 1000))


@dataclass(frozen=True)
class Lease:
    """A granted lease.

    ``token`` is the fencing token: it grows with every change of hands, so a
    write stamped with an older token can be refused.
    """

    key: str
    holder: str
    token: int
    expires_at: datetime


@runtime_checkable
class LeaseService(Protocol):
    """A lease service judges expiry on one clock: its own store's."""

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder``; None while another holder's lease is live.

        Never blocks. The same holder re-acquiring a live lease keeps its token
        and gets a fresh expiry.
        """
        ...

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend a live lease of the same holder and token; None otherwise."""
        ...

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still the current one; else do nothing."""
        ...

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, or None once it lapsed or was released."""
        ...
