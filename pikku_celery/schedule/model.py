"""A schedule as registered, and what the store remembers of it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from ..model.values import JSON
from .spec import TickSpec


class Overlap(StrEnum):
    """What a tick does while the schedule's previous run has not ended."""

    SKIP = "skip"
    """No run for this tick (the tick is recorded as passed)."""
    ALLOW = "allow"
    """Start this tick's run beside the previous one."""
    CANCEL_PREVIOUS = "cancel_previous"
    """Ask the previous run to cancel, then start this tick's run."""


@dataclass(frozen=True)
class Schedule:
    """A workflow started on every tick of ``spec`` with ``input``.

    ``catch_up``: how many ticks missed before the newest due one (beat was
    down) are started too, oldest first; the rest are dropped.
    """

    name: str
    workflow: str
    spec: TickSpec
    input: JSON = None
    overlap: Overlap = Overlap.SKIP
    catch_up: int = 0

    def key(self, tick_ms: int) -> str:
        """The idempotency key of the run of tick ``tick_ms``: every beat
        derives the same, so the tick's run is started once."""
        return f"schedule:{self.name}:{iso(tick_ms)}"


@dataclass(frozen=True)
class ScheduleState:
    """What the store remembers of a schedule (one row of ``pikku_schedule``).

    Times are epoch milliseconds on the store's clock. ``last_tick_ms`` is the
    newest tick handled (started or skipped); ``last_run_id`` the run its
    newest started tick named.
    """

    name: str
    workflow: str
    spec: str
    last_tick_ms: int
    next_tick_ms: int
    last_run_id: str | None
    updated_at_ms: int


def iso(ms: int) -> str:
    """Epoch ms as an ISO 8601 UTC instant, to the millisecond."""
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )
