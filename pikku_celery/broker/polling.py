"""Feeding kombu's event loop from a queue that has no socket to watch.

``celery worker`` runs its event loop only for a transport that can be driven
by one, and only with the loop does its prefork pool give each pool process a
job pipe of its own. Without it, billiard's pool processes share one job pipe
under one lock, held by an idle process while it waits for work: SIGKILL that
process and the lock is never released, so the whole pool stops while the
worker keeps taking messages. A database file cannot wake the loop, so the
loop polls it: on every turn of the loop when a consumer has room (a finished
task frees room, so the next message follows at once), and at least once per
polling interval, the loop's timer waking it, when the queue was found empty.
"""

from __future__ import annotations

import time
from queue import Empty
from typing import Any, Protocol

# The event loop polls at least this far apart, even with a polling_interval of 0.
MIN_INTERVAL = 0.005
# One poll hands over at most this many messages, so it never holds up the loop.
MAX_DELIVERIES_PER_POLL = 100


class Consuming(Protocol):
    """A channel that can say whether its consumers want a message now."""

    def wants_messages(self) -> bool:
        """True when a consumer is registered and its prefetch has room."""
        ...


class EventLoopPoller:
    """Polls one kombu virtual transport's channels from a kombu event loop (hub)."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self._loop: Any = None
        self._timer: Any = None
        self._interval = MIN_INTERVAL
        self._found_empty_at = float("-inf")

    def attach(self, loop: Any, polling_interval: float) -> None:
        """Poll from ``loop`` from now on (and from no loop it was attached to before)."""
        self.detach()
        self._loop = loop
        self._interval = max(polling_interval, MIN_INTERVAL)
        self._found_empty_at = float("-inf")
        loop.on_tick.add(self.poll_when_due)
        # The timer only wakes an otherwise idle loop; the tick does the polling.
        self._timer = loop.call_repeatedly(self._interval, self.poll_when_due)

    def detach(self) -> None:
        """Stop polling from the loop (the transport is closing, or attached elsewhere)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is not None:
            self._loop.on_tick.discard(self.poll_when_due)
            self._loop = None

    def poll_when_due(self) -> None:
        """Poll if a consumer has room, unless the queue was found empty a moment ago."""
        if not self._wanted():
            return  # no database read until an ack or reject makes room
        now = time.monotonic()
        if now - self._found_empty_at < self._interval:
            return
        if self.deliver_ready() < MAX_DELIVERIES_PER_POLL and self._wanted():
            self._found_empty_at = now  # room left, nothing ready: wait an interval

    def deliver_ready(self) -> int:
        """Hand ready messages to their consumers until none is ready or wanted."""
        cycle = self.transport.cycle
        if cycle is None:  # closed
            return 0
        for delivered in range(MAX_DELIVERIES_PER_POLL):
            try:
                cycle.get(self.transport._deliver, timeout=0)
            except Empty:
                return delivered
        return MAX_DELIVERIES_PER_POLL

    def _wanted(self) -> bool:
        channels: list[Consuming] = self.transport.channels or []
        return any(channel.wants_messages() for channel in channels)
