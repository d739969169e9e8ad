"""The test environment's clock: virtual, standing still until moved, never back."""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime, timedelta


class VirtualClock:
    """The test environment's clock: it stands still until moved, never back.

    Starts at the real time (or ``start``: an aware datetime or epoch
    seconds); only :meth:`advance` and :meth:`advance_to` move it. The store,
    the leases and the dispatcher's queue all read it.
    """

    def __init__(self, start: datetime | float | None = None) -> None:
        if start is None:
            ms = time.time_ns() // 1_000_000
        elif isinstance(start, datetime):
            if start.tzinfo is None:
                raise ValueError("VirtualClock(start=...): give an aware datetime (e.g. UTC)")
            ms = round(start.timestamp() * 1000)
        else:
            ms = round(float(start) * 1000)
        self._ms = ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        """Now, in epoch milliseconds (what the store keeps)."""
        with self._lock:
            return self._ms

    def time(self) -> float:
        """Now, in epoch seconds (what the dispatcher's queue is ordered by)."""
        return self.now_ms() / 1000

    def now(self) -> datetime:
        """Now, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now_ms() / 1000, tz=UTC)

    def advance(self, seconds: float | timedelta) -> None:
        """Move the clock ``seconds`` forward (nothing runs: see ``WorkflowTestEnv.advance``)."""
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if not value >= 0:
            raise ValueError(f"the clock only moves forward, not by {seconds!r}")
        with self._lock:
            self._ms += math.ceil(value * 1000)

    def advance_to(self, epoch_seconds: float) -> None:
        """Move the clock to ``epoch_seconds`` if that is later than now."""
        self.advance_to_ms(math.ceil(epoch_seconds * 1000 - 0.01))

    def advance_to_ms(self, epoch_ms: int) -> None:
        """Move the clock to ``epoch_ms`` if that is later than now."""
        with self._lock:
            self._ms = max(self._ms, int(epoch_ms))
