"""One retry policy for calls that failed for a passing reason.

A store write interrupted by a database restart, a transaction the database
rolled back to break a deadlock: each is worth calling again, for a while or
a few times, and nothing else is. Every retry loop in pikku is this one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """Call again while the failure is ``retryable``, within the bounds given.

    ``attempts``: at most this many calls (None: no count); ``within``: no
    new call once this many seconds have passed since the first (None: no
    time bound); between calls a pause from ``first_pause`` doubling up to
    ``max_pause`` (0: none, for a failure that clears at once).
    """

    attempts: int | None = None
    within: float | None = None
    first_pause: float = 0.0
    max_pause: float = 0.0

    def call(
        self,
        fn: Callable[[], T],
        retryable: Callable[[BaseException], bool],
        on_retry: Callable[[BaseException], None] | None = None,
    ) -> T:
        """``fn()``, called again after each retryable failure until a bound is met."""
        deadline = None if self.within is None else time.monotonic() + self.within
        pause, calls = self.first_pause, 0
        while True:
            calls += 1
            try:
                return fn()
            except Exception as exc:
                spent = (self.attempts is not None and calls >= self.attempts) or (
                    deadline is not None and time.monotonic() >= deadline
                )
                if spent or not retryable(exc):
                    raise
                if on_retry is not None:
                    on_retry(exc)
                if pause > 0:
                    # nothing else to do until the cause passes; the last pause
                    # ends at the time bound, for one call there
                    left = None if deadline is None else deadline - time.monotonic()
                    time.sleep(pause if left is None else max(0.0, min(pause, left)))
                    pause = min(pause * 2, self.max_pause)


ROLLED_BACK = RetryPolicy(attempts=5)
"""A transaction the database rolled back as a deadlock victim: run it again
at once, a few times (the other transaction has gone on)."""
