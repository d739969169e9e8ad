"""``hold_lease``: keep a lease alive around a block and say if it was lost."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import LeaseLostError, LeaseTakenError
from ..ports.lease import TTL, Lease, LeaseService, ttl_seconds

log = logging.getLogger(__name__)

# While the store errors, retry this often (at most), so a store that comes
# back shortly before the lease's expiry is still caught in time.
_MIN_RETRY = 0.01


@dataclass
class HeldLease:
    """What the ``with`` block sees: the current lease and a loss flag."""

    lease: Lease
    lost: threading.Event = field(default_factory=threading.Event)


class _Renewer(threading.Thread):
    """Renews at half the ttl; a failing store is loss only past the expiry.

    Expiry is tracked on this process's monotonic clock, never its wall
    clock: ``deadline`` is taken *before* the call that granted the lease was
    sent, so it can only fall before the store's own expiry, never after.
    """

    def __init__(
        self, service: LeaseService, held: HeldLease, ttl: float, granted_at: float
    ) -> None:
        super().__init__(name=f"pikku-lease-{held.lease.key}", daemon=True)
        self.service = service
        self.held = held
        self.ttl = ttl
        self.stop = threading.Event()
        self.deadline = granted_at + ttl

    def run(self) -> None:
        interval = self.ttl / 2
        while not self.stop.wait(interval):
            started = time.monotonic()
            try:
                renewed = self.service.refresh(self.held.lease, self.ttl)
            except Exception as exc:  # store unreachable: not yet a loss
                now = time.monotonic()
                if now >= self.deadline:
                    log.warning("lease %s lost: store unreachable past expiry", self.held.lease.key)
                    self.held.lost.set()
                    return
                log.info("lease %s renewal failed, retrying: %s", self.held.lease.key, exc)
                # Retry sooner; halve the remaining time so some attempt
                # lands just before the expiry rather than just after it.
                interval = max(_MIN_RETRY, min(self.ttl / 8, (self.deadline - now) / 2))
                continue
            if renewed is None:
                self.held.lost.set()
                return
            self.held.lease = renewed
            self.deadline = started + self.ttl
            interval = self.ttl / 2


@contextmanager
def hold_lease(
    service: LeaseService, key: str, ttl: TTL, holder: str | None = None
) -> Iterator[HeldLease]:
    """Hold ``key`` for the duration of the block.

    Raises :class:`LeaseTakenError` when another holder has it, and
    :class:`LeaseLostError` on exit when the lease lapsed or changed hands while
    the block ran (so its result is not taken as produced under the lease).
    An exception from the block propagates unchanged.
    """
    seconds = ttl_seconds(ttl)
    holder = holder or _default_holder()
    granted_at = time.monotonic()
    lease = service.acquire(key, holder, seconds)
    if lease is None:
        raise LeaseTakenError(key)
    held = HeldLease(lease)
    renewer = _Renewer(service, held, seconds, granted_at)
    renewer.start()
    try:
        yield held
    except BaseException:
        renewer.stop.set()
        renewer.join()
        _release_quietly(service, held.lease)
        raise
    renewer.stop.set()
    renewer.join()
    if held.lost.is_set():
        raise LeaseLostError(key, "renewal was refused or the store stayed unreachable")
    try:
        current = service.get(key)
    except Exception as exc:
        # Cannot confirm: trust the last grant only while it is surely live.
        # (Judged on the monotonic clock: the wall clock may be far off.)
        if time.monotonic() >= renewer.deadline:
            raise LeaseLostError(key, f"could not confirm the lease: {exc}") from exc
        _release_quietly(service, held.lease)
        return
    if current is None or current.holder != held.lease.holder or current.token != held.lease.token:
        raise LeaseLostError(key, "it lapsed or another holder took it")
    _release_quietly(service, held.lease)


def _release_quietly(service: LeaseService, lease: Lease) -> None:
    try:
        service.release(lease)
    except Exception as exc:  # best effort: it lapses by itself
        log.info("releasing lease %s failed: %s", lease.key, exc)


def _default_holder() -> str:
    import os
    import socket
    import uuid

    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"
