"""The memory store's sweep queries and retention, as the SQL store's answer them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..model.values import (
    JSON,
    AttemptState,
    AuditEntry,
    RunState,
    RunStatus,
    StepKind,
    StepState,
    StepStatus,
)
from .prune import PruneBatch, PruneCounts, PruneQuery
from .rules import (
    lease_lapsed,
    sweep_backoff_ms,
    sweep_order,
)


class MemorySweep:
    """What the beat sweep and the pruner ask of the memory store (its dicts
    are the store's own: :class:`~.memory.InMemoryWorkflowStore`)."""

    _clock: Callable[[], int]
    _lock: threading.RLock
    _runs: dict[str, RunState]
    _keys: dict[tuple[str, str], str]
    _steps: dict[str, StepState]
    _run_steps: dict[str, list[str]]
    _attempts: dict[str, list[AttemptState]]
    _signals: dict[str, dict[str, JSON]]
    _step_sweeps: dict[str, tuple[int, int]]
    _audit: list[AuditEntry]

    # --- sweep ---------------------------------------------------------------
    def _oldest_steps(
        self, keep: Callable[[StepState, int], bool], age: Callable[[StepState], int], limit: int
    ) -> list[StepState]:
        """The sweep's scan: matching steps out of their backoff, in the
        sweep's order (:func:`~.rules.sweep_order`), at most ``limit``."""
        with self._lock:
            now = self._clock()
            found: list[tuple[int, StepState]] = []
            for s in self._steps.values():
                if not keep(s, now):
                    continue
                swept = self._step_sweeps.get(s.id)
                order = sweep_order(0 if swept is None else swept[0], age(s), now)
                if order is not None:
                    found.append((order, s))
        found.sort(key=lambda pair: pair[0])
        return [s for _, s in found[:limit]]

    def lapsed_steps(self, limit: int, bound_ms: int | None = None) -> list[StepState]:
        return self._oldest_steps(
            lambda s, now: (
                s.status == StepStatus.RUNNING and lease_lapsed(s.lease_expires_at, now, bound_ms)
            ),
            lambda s: s.lease_expires_at or 0,
            limit,
        )

    def undispatched_steps(self, older_than_ms: int, limit: int) -> list[StepState]:
        def sent(s: StepState) -> int:
            return s.scheduled_at if s.scheduled_at is not None else s.created_at

        return self._oldest_steps(
            lambda s, now: (
                s.kind == StepKind.TASK
                and s.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
                and sent(s) <= now - older_than_ms
            ),
            sent,
            limit,
        )

    def due_steps(self, limit: int) -> list[StepState]:
        return self._oldest_steps(
            lambda s, now: (
                s.status in (StepStatus.SCHEDULED, StepStatus.FAILED)
                and s.wake_at is not None
                and s.wake_at <= now
            ),
            lambda s: s.wake_at or 0,
            limit,
        )

    def idle_runs(self, idle_ms: int, limit: int) -> list[RunState]:
        with self._lock:
            cutoff = self._clock() - idle_ms
            now = cutoff + idle_ms
            found = [
                r
                for r in self._runs.values()
                if r.status == RunStatus.RUNNING
                and r.updated_at <= cutoff
                and (r.next_sweep_at is None or r.next_sweep_at <= now)
                and all(self._steps[s].settled for s in self._run_steps[r.id])
            ]
        # as the SQL store orders them: by the sweep's next look, else the last pass
        found.sort(key=lambda r: r.updated_at if r.next_sweep_at is None else r.next_sweep_at)
        return found[:limit]

    def overdue_runs(self, limit: int) -> list[RunState]:
        with self._lock:
            now = self._clock()
            found = [
                r
                for r in self._runs.values()
                if r.status == RunStatus.RUNNING
                and r.deadline_at is not None
                and r.deadline_at <= now
                and (r.next_sweep_at is None or r.next_sweep_at <= now)
            ]
        found.sort(key=lambda r: r.deadline_at or 0)
        return found[:limit]

    def mark_blocked(self, run_id: str, reason: str) -> None:
        with self._lock:
            run = self._runs.get(run_id)
            if run is not None and not run.status.terminal:
                self._runs[run_id] = replace(run, blocked=reason)

    def waiting_by_queue(self, older_than_ms: int) -> list[tuple[str | None, int, int]]:
        with self._lock:
            now = self._clock()
            found: dict[str | None, tuple[int, int]] = {}
            for s in self._steps.values():
                sent = s.scheduled_at if s.scheduled_at is not None else s.created_at
                if (
                    s.kind == StepKind.TASK
                    and s.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
                    and sent <= now - older_than_ms
                ):
                    count, oldest = found.get(s.queue, (0, now))
                    found[s.queue] = (count + 1, min(oldest, sent))
        rows = [(q, count, now - oldest) for q, (count, oldest) in found.items()]
        return sorted(rows, key=lambda r: (-r[1], -r[2], r[0] or ""))

    def note_steps_swept(
        self, step_ids: Sequence[str], backoff_ms: int, max_backoff_ms: int | None = None
    ) -> None:
        cap = backoff_ms if max_backoff_ms is None else max_backoff_ms
        with self._lock:
            now = self._clock()
            for sid in step_ids:
                if sid in self._steps:
                    _, count = self._step_sweeps.get(sid, (0, 0))
                    wait = sweep_backoff_ms(backoff_ms, count, cap)
                    self._step_sweeps[sid] = (now + wait, count + 1)

    def note_swept(self, run_id: str, backoff_ms: int, max_backoff_ms: int | None = None) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            now = self._clock()
            if run is None or run.status.terminal:
                return False
            if run.next_sweep_at is not None and run.next_sweep_at > now:
                return False
            wait = sweep_backoff_ms(
                backoff_ms,
                run.sweep_count,
                backoff_ms if max_backoff_ms is None else max_backoff_ms,
            )
            self._runs[run_id] = replace(
                run, next_sweep_at=now + wait, sweep_count=run.sweep_count + 1
            )
            return True

    # --- retention (the reference for .prune_sql) ---------------------------
    def _prune_roots(self, query: PruneQuery) -> list[RunState]:
        """Roots the query matches, oldest settled first, after its cursor."""
        after = query.after if query.after is not None else (-1, "")
        return sorted(
            (
                r
                for r in self._runs.values()
                if r.parent_run_id is None
                and r.status.terminal
                and r.updated_at <= query.cutoff_ms
                and (query.status is None or r.status == query.status)
                and (query.workflow is None or r.workflow == query.workflow)
                and (r.updated_at, r.id) > after
            ),
            key=lambda r: (r.updated_at, r.id),
        )

    def count_prunable(self, query: PruneQuery) -> int:
        """How many roots the query's filters match."""
        with self._lock:
            return len(self._prune_roots(query))

    def prune_batch(self, query: PruneQuery, *, dry_run: bool = False) -> PruneBatch:
        """Delete up to ``query.batch_size`` settled run trees at once."""
        began = time.perf_counter()
        found = PruneBatch()
        with self._lock:
            roots = self._prune_roots(query)[: query.batch_size]
            found.looked_at = len(roots)
            if roots:
                found.after = (roots[-1].updated_at, roots[-1].id)
            children: dict[str, list[str]] = {}
            for r in self._runs.values():
                if r.parent_run_id is not None:
                    children.setdefault(r.parent_run_id, []).append(r.id)
            doomed: list[str] = []
            for root in roots:
                tree, todo = [root.id], list(children.get(root.id, []))
                while todo:
                    kid = todo.pop()
                    tree.append(kid)
                    todo.extend(children.get(kid, []))
                runs = [self._runs[i] for i in tree]
                if all(r.status.terminal and r.updated_at <= query.cutoff_ms for r in runs):
                    doomed.extend(tree)
                    found.trees += 1
            found.counts = self._drop_runs(doomed, dry_run)
        found.held_ms = (time.perf_counter() - began) * 1000
        return found

    def _drop_runs(self, run_ids: list[str], dry_run: bool) -> PruneCounts:
        gone = set(run_ids)
        steps = [sid for rid in run_ids for sid in self._run_steps.get(rid, [])]
        counts = PruneCounts(
            runs=len(run_ids),
            steps=len(steps),
            attempts=sum(len(self._attempts.get(sid, [])) for sid in steps),
            signals=sum(len(self._signals.get(rid, {})) for rid in run_ids),
            audit=sum(1 for e in self._audit if e.run_id in gone),
        )
        if dry_run:
            return counts
        for sid in steps:
            self._steps.pop(sid, None)
            self._attempts.pop(sid, None)
            self._step_sweeps.pop(sid, None)
        for rid in run_ids:
            run = self._runs.pop(rid)
            self._run_steps.pop(rid, None)
            self._signals.pop(rid, None)
            if run.idempotency_key is not None:
                self._keys.pop((run.workflow, run.idempotency_key), None)
        self._audit = [e for e in self._audit if e.run_id not in gone]
        return counts
