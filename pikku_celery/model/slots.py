"""Concurrency slots: at most ``limit`` running runs per concurrency key.

A run of a workflow with a concurrency key is created ``queued``; entering
its key's slots either admits it (the run becomes ``running`` in the same
write), queues it behind the runs already waiting, or ends it cancelled.
Leaving (its run settled) admits the oldest waiting runs in the same write.
Every entry and exit of a key is serialised on that key's row, so two starts
racing on one key never both take its last slot.

What to do is decided by the pure functions here, which the memory store and
the SQL store both apply under their lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from .values import ErrorInfo, RunState

OnLimit = Literal["queue", "cancel_in_progress", "cancel_newest"]
"""What a start does when its key's slots are all taken: wait for one, cancel
the runs holding them (and those waiting), or end the new run cancelled."""

ON_LIMIT: tuple[OnLimit, ...] = ("queue", "cancel_in_progress", "cancel_newest")


@dataclass(frozen=True)
class Slot:
    """One run's place on a key: holding a slot, or waiting (by ``seq``, its start order)."""

    run_id: str
    key: str
    seq: int
    holding: bool


@dataclass(frozen=True)
class SlotEntry:
    """What entering a key did.

    ``admitted``: the run holds a slot and is running now; ``queued``: it
    waits; neither: it ended cancelled (``cancel_newest``). ``ended``: runs
    that were waiting and ended cancelled by this entry
    (``cancel_in_progress``); ``to_cancel``: running holders whose
    cancellation the caller asks for (they leave their slot once settled);
    ``promoted``: waiting runs this entry found slots free for (the key's
    limit was raised) and admitted ahead of it, running now (the caller
    wakes them).
    """

    admitted: bool
    queued: bool
    ended: list[str] = field(default_factory=list)
    to_cancel: list[str] = field(default_factory=list)
    promoted: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EntryPlan:
    """What to write for one entry (see :func:`plan_entry`)."""

    holding: bool  # the new run takes a slot now
    queued: bool  # the new run waits
    evict: list[str]  # waiting runs that end cancelled
    cancel: list[str]  # holders to ask to cancel
    promote: list[str] = field(default_factory=list)  # waiting runs admitted first


def plan_entry(
    holders: Sequence[Slot], waiting: Sequence[Slot], limit: int, on_limit: OnLimit
) -> EntryPlan:
    """The entry of a new run on a key whose slots are ``holders`` and ``waiting``
    (each in start order)."""
    free = len(holders) < limit
    if on_limit == "cancel_newest":
        return EntryPlan(holding=free, queued=False, evict=[], cancel=[])
    if on_limit == "cancel_in_progress":
        # The newest start wins: the waiting ones end now, and as many of the
        # oldest holders as leave it a slot are asked to cancel.
        over = len(holders) - limit + 1
        cancel = [s.run_id for s in holders[: max(0, over)]]
        return EntryPlan(
            holding=free, queued=not free, evict=[s.run_id for s in waiting], cancel=cancel
        )
    # Slots free while runs wait (the limit was raised since they entered) go
    # to them first: never a new run ahead of one that waited longer.
    promote = plan_promotion(len(holders), waiting, limit)
    take = len(holders) + len(promote) < limit and len(promote) == len(waiting)
    return EntryPlan(holding=take, queued=not take, evict=[], cancel=[], promote=promote)


def plan_promotion(holders: int, waiting: Sequence[Slot], limit: int) -> list[str]:
    """The waiting runs that take the slots free (``limit - holders``), oldest first."""
    return [s.run_id for s in waiting[: max(0, limit - holders)]]


def evicted_error(key: str) -> ErrorInfo:
    """The error of a run ended cancelled by its concurrency key."""
    return {
        "type": "WorkflowCancelledError",
        "message": f"cancelled by the concurrency limit of key {key!r}",
        "traceback": "",
    }


@runtime_checkable
class ConcurrencySlots(Protocol):
    """A store's concurrency slots: each call one transaction, serialised per key."""

    def enter_slot(self, run_id: str, key: str, limit: int, on_limit: OnLimit) -> SlotEntry:
        """Enter the queued run ``run_id`` on ``key`` (see :class:`SlotEntry`).
        A run already on a key keeps its place (a second call changes nothing)."""
        ...

    def leave_slot(self, run_id: str) -> list[str]:
        """Take the run off its key; the waiting runs this frees a slot for,
        oldest first, are running when this returns (their ids)."""
        ...

    def cancel_queued(self, run_id: str, error: ErrorInfo) -> bool:
        """End a queued run cancelled and take it off its key; False (nothing
        done) once it is no longer queued."""
        ...

    def stale_slots(self, limit: int) -> list[str]:
        """Runs on a key that should not be: settled or gone (the caller
        takes them off with :meth:`leave_slot`). At most ``limit``."""
        ...

    def unslotted_runs(self, older_than_ms: int, limit: int) -> list[RunState]:
        """Queued runs on no key, created longer ago than ``older_than_ms``:
        their start stopped between creating the run and entering its key."""
        ...

    def slots_of(self, key: str) -> list[Slot]:
        """Every run on ``key``: holders first, each group in start order."""
        ...


@runtime_checkable
class HasConcurrencySlots(Protocol):
    """A store that keeps concurrency slots beside its runs."""

    def concurrency_slots(self) -> ConcurrencySlots:
        """Its slots, written in the same database as its runs."""
        ...
