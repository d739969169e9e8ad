"""The ``ScheduleStore`` port, and the in-memory adapter.

The store only remembers how far each schedule got; it never decides
whether a tick's run starts (the tick's idempotency key does), so two beats
writing the same tick is harmless. ``note_tick`` never moves a schedule back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from .model import ScheduleState


class ScheduleStore(Protocol):
    """Where schedules' progress is kept, on the store's clock."""

    def now_ms(self) -> int:
        """The store's clock, in epoch milliseconds."""
        ...

    def schedule_states(self) -> dict[str, ScheduleState]:
        """Every schedule's row, by name."""
        ...

    def note_tick(self, state: ScheduleState) -> bool:
        """Record ``state`` unless the stored row has a newer tick (or the same
        tick with a run, when ``state`` names none). True when written."""
        ...


def newer(stored: ScheduleState | None, state: ScheduleState) -> bool:
    """Whether ``state`` may replace ``stored`` (see :meth:`ScheduleStore.note_tick`)."""
    if stored is None or stored.last_tick_ms < state.last_tick_ms:
        return True
    return stored.last_tick_ms == state.last_tick_ms and state.last_run_id is not None


class InMemoryScheduleStore:
    """Schedules' progress in a dict, on ``clock`` (the workflow store's, so
    memory-backed tests keep one clock)."""

    def __init__(self, clock: Callable[[], int] | None = None) -> None:
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._rows: dict[str, ScheduleState] = {}
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        """The clock given at construction."""
        return self._clock()

    def schedule_states(self) -> dict[str, ScheduleState]:
        """A copy of every row."""
        with self._lock:
            return dict(self._rows)

    def note_tick(self, state: ScheduleState) -> bool:
        """Keep ``state`` when it is newer (the run id kept when it names none)."""
        with self._lock:
            stored = self._rows.get(state.name)
            if not newer(stored, state):
                return False
            if state.last_run_id is None and stored is not None:
                state = replace(state, last_run_id=stored.last_run_id)
            self._rows[state.name] = replace(state, updated_at_ms=self._clock())
            return True
