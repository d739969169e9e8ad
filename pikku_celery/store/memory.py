"""The workflow store in process memory: the reference semantics, and fast tests.

One lock serialises every operation, which makes each the single guarded write
the SQL store performs. Values are stored as JSON round-trips so callers never
share mutable state with the store, exactly as with a database.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import (
    RunNotFoundError,
    RunSettledError,
    StoreError,
    WorkflowStepFunctionMismatchError,
)
from ..model.changes import (
    fence_holds,
    new_claim_id,
    run_created,
    step_after_outcome,
    step_claimed,
    step_closed,
    step_resolved,
    superseded,
)
from ..model.cursor import COUNT_CAP, RunCursor
from ..model.plan import Moved, ParentSettle, PassView, PassWrite
from ..model.values import (
    BROKER,
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Delivery,
    ErrorInfo,
    NewRun,
    Operator,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)
from ..payload import loads, normalise
from . import events
from .memory_leases import MemoryStepLeases
from .memory_pages import MemoryPages
from .memory_sweep import MemorySweep
from .plain_claim import PlainClaim
from .rules import (
    check_resent,
    lease_lapsed,
)
from .slots_memory import MemoryConcurrencySlots


def _process_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class InMemoryWorkflowStore(PlainClaim, MemoryStepLeases, MemorySweep, MemoryPages):
    """A :class:`WorkflowStore` for one process; thread-safe."""

    def __init__(self, clock: Callable[[], int] = _process_clock_ms) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._runs: dict[str, RunState] = {}
        self._keys: dict[tuple[str, str], str] = {}
        self._steps: dict[str, StepState] = {}
        self._run_steps: dict[str, list[str]] = {}
        self._attempts: dict[str, list[AttemptState]] = {}
        self._signals: dict[str, dict[str, JSON]] = {}
        # the sweep's per-step backoff: step id -> (next_sweep_at, sweep_count)
        self._step_sweeps: dict[str, tuple[int, int]] = {}
        self._audit: list[AuditEntry] = []
        self._audit_ids = itertools.count(1)  # never reused, pruned or not
        self._slots: MemoryConcurrencySlots | None = None

    # --- clock ---------------------------------------------------------------
    def now_ms(self) -> int:
        return self._clock()

    def concurrency_slots(self) -> MemoryConcurrencySlots:
        """Its concurrency slots (see :mod:`.slots`), under the same lock."""
        if self._slots is None:
            self._slots = MemoryConcurrencySlots(self)
        return self._slots

    # --- runs ----------------------------------------------------------------
    def create_run(self, new: NewRun) -> tuple[RunState, bool]:
        value = normalise(new.input, f"workflow {new.workflow!r}", "input")
        with self._lock:
            if new.idempotency_key is not None:
                existing = self._keys.get((new.workflow, new.idempotency_key))
                if existing is not None:
                    return self._runs[existing], False
            if new.id in self._runs:
                raise StoreError(f"a workflow run with id {new.id!r} already exists")
            run = self._insert_run(new, value)
            return run, True

    def _insert_run(self, new: NewRun, value: JSON) -> RunState:
        run = run_created(new, value, self._clock())
        self._runs[run.id] = run
        self._run_steps[run.id] = []
        self._signals[run.id] = {}
        if new.idempotency_key is not None:
            self._keys[(new.workflow, new.idempotency_key)] = run.id
        return run

    def get_run(self, run_id: str) -> RunState | None:
        """The run, or None if there is no run with that id."""
        with self._lock:
            return self._runs.get(run_id)

    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 50,
        offset: int = 0,
        before: RunCursor | None = None,
    ) -> list[RunState]:
        with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (status is None or r.status == status)
                and (workflow is None or r.workflow == workflow)
                and (since is None or r.created_at >= since)
                and (until is None or r.created_at < until)
                and (before is None or before.admits(r))
            ]
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return runs[offset : offset + limit]

    def _run(self, run_id: str) -> RunState:
        run = self._runs.get(run_id)
        if run is None:
            raise RunNotFoundError(f"no workflow run {run_id!r}")
        return run

    def _touch_run(self, run: RunState, now: int | None = None, **changes: Any) -> RunState:
        at = self._clock() if now is None else now
        run = replace(run, version=run.version + 1, updated_at=at, **changes)
        self._runs[run.id] = run
        return run

    def request_cancel(self, run_id: str) -> RunState:
        with self._lock:
            run = self._run(run_id)
            if run.status.terminal or run.cancel_requested:
                return run
            return self._touch_run(run, cancel_requested=True)

    def send_signal(self, run_id: str, name: str, payload: JSON) -> RunState:
        value = normalise(payload, f"signal {name!r}", "payload")
        with self._lock:
            run = self._run(run_id)
            if run.status.terminal:
                raise RunSettledError(f"workflow run {run_id} is {run.status}; it takes no signals")
            signals = self._signals[run_id]
            if name in signals:
                check_resent(run_id, name, signals[name], value)
            signals.setdefault(name, value)
            return self._touch_run(run)

    def retry_run(self, run_id: str) -> RunState:
        with self._lock:
            run = self._run(run_id)
            if run.status != RunStatus.FAILED:
                raise RunSettledError(
                    f"workflow run {run_id} is {run.status}; only a failed run can be retried"
                )
            now = self._clock()
            for sid in self._run_steps[run_id]:
                step = self._steps[sid]
                if step.kind == StepKind.TASK and step.status == StepStatus.FAILED:
                    self._steps[sid] = replace(
                        step,
                        wake_at=now,
                        max_attempts=step.attempt + step.max_attempts,
                        updated_at=now,
                    )
            return self._touch_run(run, status=RunStatus.RUNNING, error=None, wake_at=now)

    # --- reads for people ----------------------------------------------------
    def record_action(
        self,
        run_id: str,
        action: AuditAction,
        operator: Operator,
        details: dict[str, JSON] | None = None,
    ) -> AuditEntry:
        kept = normalise(details or {}, f"{action} of run {run_id}", "details")
        with self._lock:
            entry = AuditEntry(
                next(self._audit_ids),
                run_id,
                AuditAction(action),
                operator.actor,
                operator.origin,
                kept,
                self._clock(),
            )
            self._audit.append(entry)
            return entry

    def audit_trail(self, run_id: str) -> list[AuditEntry]:
        with self._lock:
            return [e for e in self._audit if e.run_id == run_id]

    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepState]]:
        with self._lock:
            return {
                rid: [self._steps[sid] for sid in self._run_steps[rid]]
                for rid in run_ids
                if self._run_steps.get(rid)
            }

    def count_runs_by_status(
        self,
        *,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        counts = dict.fromkeys(RunStatus, 0)
        with self._lock:
            for r in self._runs.values():
                if (
                    (workflow is None or r.workflow == workflow)
                    and (since is None or r.created_at >= since)
                    and (until is None or r.created_at < until)
                ):
                    counts[r.status] += 1
        return counts

    def count_runs_capped(
        self,
        *,
        cap: int = COUNT_CAP,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        counts = self.count_runs_by_status(workflow=workflow, since=since, until=until)
        return {status: min(n, cap + 1) for status, n in counts.items()}

    def count_steps_by_status(self) -> dict[StepStatus, int]:
        counts = dict.fromkeys(StepStatus, 0)
        with self._lock:
            for step in self._steps.values():
                counts[step.status] += 1
        return counts

    def count_attempts_by_status(self) -> dict[AttemptStatus, int]:
        counts = dict.fromkeys(AttemptStatus, 0)
        with self._lock:
            for rows in self._attempts.values():
                for row in rows:
                    counts[row.status] += 1
        return counts

    def runs_with_key(self, idempotency_key: str, limit: int = 50) -> list[RunState]:
        with self._lock:
            runs = [r for r in self._runs.values() if r.idempotency_key == idempotency_key]
        runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
        return runs[:limit]

    def get_signals(self, run_id: str) -> dict[str, JSON]:
        with self._lock:
            return dict(self._signals.get(run_id, {}))

    # --- steps ---------------------------------------------------------------
    def in_flight_views(self, after_id: str | None = None, limit: int = 500) -> list[RunView]:
        with self._lock:
            now = self._clock()
            runs = sorted(
                (
                    r
                    for r in self._runs.values()
                    if not r.status.terminal and (after_id is None or r.id > after_id)
                ),
                key=lambda r: r.id,
            )[:limit]
            return [
                RunView(
                    run=r,
                    steps=[self._steps[sid] for sid in self._run_steps[r.id]],
                    signals=dict(self._signals[r.id]),
                    now=now,
                )
                for r in runs
            ]

    def get_steps(self, run_id: str) -> list[StepState]:
        with self._lock:
            return [self._steps[s] for s in self._run_steps.get(run_id, [])]

    def event_steps(self, run_id: str, key: str | None = None) -> list[StepState]:
        """The run's progress events (of ``key``, or of every key), in order."""
        return events.of_key(self.get_steps(run_id), key)

    def get_attempts(self, run_id: str) -> list[AttemptState]:
        with self._lock:
            out: list[AttemptState] = []
            for sid in self._run_steps.get(run_id, []):
                out.extend(self._attempts.get(sid, []))
            return sorted(out, key=lambda a: (a.started_at, a.step_id, a.attempt))

    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        with self._lock:
            step = self._step_of(step_id, run_id)
            if step is None:
                return None
            if step.task_name != task_name:
                raise WorkflowStepFunctionMismatchError(step_id, step.task_name, task_name)
            now = self._clock()
            fresh = step.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
            retry_due = (
                step.status == StepStatus.FAILED
                and step.attempt < step.max_attempts
                and step.wake_at is not None
                and step.wake_at <= now
            )
            lapsed = (
                step.status == StepStatus.RUNNING
                and lease_lapsed(step.lease_expires_at, now, bound_ms)
                and step.attempt < step.max_attempts
            )
            if step.kind != StepKind.TASK or not (fresh or retry_due or lapsed):
                return None
            if lapsed:
                self._set_attempt(step_id, step.attempt, status=AttemptStatus.SUPERSEDED)
            claimed = step_claimed(step, worker, lease_ms, now, new_claim_id())
            self._steps[step_id] = claimed
            self._attempts.setdefault(step_id, []).append(
                AttemptState(
                    step_id,
                    claimed.attempt,
                    AttemptStatus.RUNNING,
                    worker=worker,
                    started_at=now,
                    claim_id=claimed.claim_id,
                    dispatch=BROKER,
                    task_id=None if delivery is None else delivery.task_id,
                    node=None if delivery is None else delivery.node,
                )
            )
            return claimed

    def _fenced(
        self, step_id: str, attempt: int, claim_id: str | None, run_id: str | None
    ) -> StepState:
        step = self._step_of(step_id, run_id)
        if step is None or not fence_holds(step, attempt, claim_id):
            raise superseded(step_id, step, attempt, claim_id)
        return step

    def complete_step(
        self,
        step_id: str,
        attempt: int,
        result: JSON,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        value = normalise(result, f"step {step_id}", "result")
        with self._lock:
            self._complete(self._fenced(step_id, attempt, claim_id, run_id), value)

    def _complete(self, step: StepState, value: JSON, now: int | None = None) -> None:
        now = self._clock() if now is None else now
        done = StepOutcome(step.id, step.attempt, ok=True, result=value)
        self._steps[step.id] = step_after_outcome(step, done, now)
        self._set_attempt(
            step.id, step.attempt, status=AttemptStatus.SUCCEEDED, result=value, finished_at=now
        )

    def fail_step(
        self,
        step_id: str,
        attempt: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        err = normalise(error, f"step {step_id}", "error")
        with self._lock:
            self._fail(self._fenced(step_id, attempt, claim_id, run_id), err, retry_delay)

    def _fail(
        self,
        step: StepState,
        err: ErrorInfo | None,
        retry_delay: float | None,
        now: int | None = None,
    ) -> None:
        now = self._clock() if now is None else now
        failed = StepOutcome(step.id, step.attempt, ok=False, error=err, retry_delay=retry_delay)
        self._steps[step.id] = step_after_outcome(step, failed, now)
        self._set_attempt(
            step.id, step.attempt, status=AttemptStatus.FAILED, error=err, finished_at=now
        )

    def mark_scheduled(self, step_ids: Sequence[str]) -> None:
        with self._lock:
            now = self._clock()
            for sid in step_ids:
                step = self._steps.get(sid)
                if step is None or step.settled or step.status == StepStatus.RUNNING:
                    continue
                status = StepStatus.SCHEDULED if step.status == StepStatus.PENDING else step.status
                self._steps[sid] = replace(step, status=status, scheduled_at=now)

    # --- the orchestration pass ---------------------------------------------
    def read_pass(
        self, run_id: str, known: PassView | None = None, optimistic: bool = False
    ) -> PassView:
        with self._lock:
            run = self._run(run_id)
            steps, signals = self.get_steps(run_id), dict(self._signals[run_id])
            return PassView(RunView(run=run, steps=steps, signals=signals, now=self._clock()))

    def write_pass(self, read: PassView, plan: PassWrite) -> AdvanceResult | Moved:
        with self._lock:
            if self._run(plan.run.id).version != plan.version:
                return Moved(plan.run.id)
            return self._write(plan)

    def _write(self, plan: PassWrite) -> AdvanceResult:
        """Apply ``plan`` to the dicts, as the SQL store's statements write it
        (the caller holds the lock and checked the run's version)."""
        now = plan.now
        if plan.outcome is not None:
            done = plan.outcome.outcome
            step = self._fenced(done.step_id, done.attempt, done.claim_id, plan.run.id)
            if done.ok:
                self._complete(step, done.result, now)
            else:
                self._fail(step, done.error, done.retry_delay, now)
        if plan.decision is None:
            return plan.landed([], False)
        for res in plan.resolved:
            step = self._steps[res.step.id]
            if step.settled:
                continue
            ok = res.step.status == StepStatus.SUCCEEDED
            self._steps[step.id] = step_resolved(step, ok, res.step.result, res.step.error, now)
            if res.attempt is not None:
                self._end_attempt(step, res.attempt, res.step.result, res.step.error, now)
        for row in plan.inserts:
            if row.child is not None:
                self._insert_run(row.child, loads(row.child_input))
            self._steps[row.step.id] = row.step
            self._run_steps[plan.run.id].append(row.step.id)
            if row.attempt is not None:
                self._attempts[row.step.id] = [row.attempt]
        for sent in plan.redispatch:
            self._steps[sent.id] = replace(self._steps[sent.id], scheduled_at=now)
        if plan.close_open is not None:
            self._close_live(plan.run.id, now, plan.close_open)
        cancelled: list[str] = []
        for child_id in plan.cancel_children:
            child = self._runs.get(child_id)
            if child is not None and not child.status.terminal and not child.cancel_requested:
                self._touch_run(child, cancel_requested=True)
                cancelled.append(child_id)
        woken = plan.parent is not None and self._settle_parent_step(plan.parent, now)
        self._runs[plan.run.id] = plan.run
        if plan.successor is not None:  # continue_as_new: in the same write
            self._insert_run(plan.successor, loads(plan.successor_input))
        return plan.landed(cancelled, woken)

    def _end_attempt(
        self,
        step: StepState,
        status: AttemptStatus,
        result: JSON,
        error: ErrorInfo | None,
        now: int,
    ) -> None:
        self._set_attempt(
            step.id, step.attempt, status=status, result=result, error=error, finished_at=now
        )

    def _close_live(self, run_id: str, now: int, err: ErrorInfo) -> None:
        """A cancelled (or timed out) run's open steps fail and its running
        attempts end cancelled."""
        for sid in self._run_steps[run_id]:
            step = self._steps[sid]
            if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING):
                self._steps[sid] = step_closed(step, err, now)
            for row in self._attempts.get(sid, []):
                if row.status == AttemptStatus.RUNNING:
                    self._set_attempt(
                        sid, row.attempt, status=AttemptStatus.CANCELLED, error=err, finished_at=now
                    )

    def _settle_parent_step(self, settle: ParentSettle, now: int) -> bool:
        """The parent's step, if it still waits on this child."""
        step = self._steps.get(settle.step_id)
        parent = self._runs.get(settle.run_id)
        if step is None or parent is None or step.status != StepStatus.RUNNING:
            return False
        if step.child_run_id != settle.child_run_id:
            return False
        ok, result, error = settle.ok, settle.result, settle.error
        self._steps[step.id] = step_resolved(step, ok, result, error, now)
        ended = AttemptStatus.SUCCEEDED if ok else AttemptStatus.FAILED
        self._end_attempt(step, ended, result, error, now)
        if not parent.status.terminal:
            self._touch_run(parent)
        return True
