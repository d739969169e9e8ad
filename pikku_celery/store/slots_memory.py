"""Concurrency slots of :class:`~.memory.InMemoryWorkflowStore`: under its lock."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..model.slots import OnLimit, Slot, SlotEntry, evicted_error, plan_entry, plan_promotion
from ..model.values import ErrorInfo, RunState, RunStatus

if TYPE_CHECKING:
    from .memory import InMemoryWorkflowStore


class MemoryConcurrencySlots:
    """The reference slots: one lock for everything, as the memory store."""

    def __init__(self, store: InMemoryWorkflowStore) -> None:
        self._store = store
        self._slots: dict[str, Slot] = {}  # by run id
        self._limits: dict[str, int] = {}  # by key: the limit its last entry gave
        self._seq = 0

    def _on(self, key: str) -> tuple[list[Slot], list[Slot]]:
        on = sorted((s for s in self._slots.values() if s.key == key), key=lambda s: s.seq)
        return [s for s in on if s.holding], [s for s in on if not s.holding]

    def _set(self, run_id: str, status: RunStatus, error: ErrorInfo | None = None) -> bool:
        """A queued run made ``status``; False if it is not queued."""
        store = self._store
        run = store._runs.get(run_id)
        if run is None or run.status != RunStatus.QUEUED:
            return False
        if status == RunStatus.CANCELLED:
            store._touch_run(run, status=status, error=error)
        else:  # admitted: the same version, as on SQL (no pass has read it)
            store._runs[run_id] = replace(run, status=status, updated_at=store.now_ms())
        return True

    def enter_slot(self, run_id: str, key: str, limit: int, on_limit: OnLimit) -> SlotEntry:
        with self._store._lock:
            self._limits[key] = limit
            mine = self._slots.get(run_id)
            if mine is not None:
                return SlotEntry(admitted=mine.holding, queued=not mine.holding)
            holders, waiting = self._on(key)
            plan = plan_entry(holders, waiting, limit, on_limit)
            for evicted in plan.evict:
                del self._slots[evicted]
                self._set(evicted, RunStatus.CANCELLED, evicted_error(key))
            for rid in plan.promote:
                self._slots[rid] = replace(self._slots[rid], holding=True)
                self._set(rid, RunStatus.RUNNING)
            if plan.holding or plan.queued:
                self._seq += 1
                self._slots[run_id] = Slot(run_id, key, self._seq, plan.holding)
            if plan.holding:
                self._set(run_id, RunStatus.RUNNING)
            elif not plan.queued:
                self._set(run_id, RunStatus.CANCELLED, evicted_error(key))
            return SlotEntry(plan.holding, plan.queued, plan.evict, plan.cancel, plan.promote)

    def leave_slot(self, run_id: str) -> list[str]:
        with self._store._lock:
            mine = self._slots.pop(run_id, None)
            if mine is None:
                return []
            holders, waiting = self._on(mine.key)
            admitted = plan_promotion(len(holders), waiting, self._limits.get(mine.key, 1))
            for rid in admitted:
                self._slots[rid] = Slot(rid, mine.key, self._slots[rid].seq, True)
                self._set(rid, RunStatus.RUNNING)
            return admitted

    def cancel_queued(self, run_id: str, error: ErrorInfo) -> bool:
        with self._store._lock:
            if not self._set(run_id, RunStatus.CANCELLED, error):
                return False
            self._slots.pop(run_id, None)
            return True

    def stale_slots(self, limit: int) -> list[str]:
        with self._store._lock:
            runs = self._store._runs
            stale = [
                s.run_id
                for s in sorted(self._slots.values(), key=lambda s: s.seq)
                if s.run_id not in runs or runs[s.run_id].status.terminal
            ]
            return stale[:limit]

    def unslotted_runs(self, older_than_ms: int, limit: int) -> list[RunState]:
        with self._store._lock:
            cutoff = self._store.now_ms() - older_than_ms
            found = [
                r
                for r in self._store._runs.values()
                if r.status == RunStatus.QUEUED
                and r.id not in self._slots
                and r.created_at <= cutoff
            ]
            return sorted(found, key=lambda r: r.created_at)[:limit]

    def slots_of(self, key: str) -> list[Slot]:
        with self._store._lock:
            holders, waiting = self._on(key)
            return holders + waiting
