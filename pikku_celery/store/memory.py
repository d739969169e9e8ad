"""The workflow store in process memory: the reference semantics, and fast tests.

One lock serialises every operation, which makes each the single guarded write
the SQL store performs. Values are stored as JSON round-trips so callers never
share mutable state with the store, exactly as with a database.
"""

from __future__ import annotations

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
from ..payload import loads, normalise
from .base import Decide
from .changes import (
    eager_claim_of,
    fence_holds,
    new_claim_id,
    run_after_pass,
    run_created,
    step_claimed,
    step_created,
    step_created_claimed,
    step_parked_on_child,
    step_resolved,
    superseded,
)
from .model import (
    BROKER,
    EAGER,
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Decision,
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
from .rules import (
    EncodedStep,
    check_resent,
    child_outcome,
    encode_decision,
    lease_expired_error,
    lease_lapsed,
    run_cancelled_error,
    step_after_outcome,
    step_closed,
    sweep_backoff_ms,
    sweep_order,
)


def _process_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class InMemoryWorkflowStore:
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

    # --- clock ---------------------------------------------------------------
    def now_ms(self) -> int:
        return self._clock()

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
    ) -> list[RunState]:
        with self._lock:
            runs = [
                r
                for r in self._runs.values()
                if (status is None or r.status == status)
                and (workflow is None or r.workflow == workflow)
                and (since is None or r.created_at >= since)
                and (until is None or r.created_at < until)
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
                len(self._audit) + 1,
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

    def get_step(self, step_id: str) -> StepState | None:
        """The step, or None if there is no step with that id."""
        with self._lock:
            return self._steps.get(step_id)

    def get_attempts(self, run_id: str) -> list[AttemptState]:
        with self._lock:
            out: list[AttemptState] = []
            for sid in self._run_steps.get(run_id, []):
                out.extend(self._attempts.get(sid, []))
            return sorted(out, key=lambda a: (a.started_at, a.step_id, a.attempt))

    def _set_attempt(self, step_id: str, attempt: int, **changes: Any) -> None:
        rows = self._attempts.setdefault(step_id, [])
        for i, row in enumerate(rows):
            if row.attempt == attempt:
                rows[i] = replace(row, **changes)
                return

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
            step = self._steps.get(step_id)
            if step is None or (run_id is not None and step.run_id != run_id):
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

    def refresh_step_lease(
        self, step_id: str, attempt: int, lease_ms: int | None, claim_id: str | None = None
    ) -> bool:
        with self._lock:
            step = self._steps.get(step_id)
            now = self._clock()
            if (
                step is None
                or not fence_holds(step, attempt, claim_id)
                or (step.lease_expires_at is not None and step.lease_expires_at <= now)
            ):
                return False
            expires = None if lease_ms is None else now + lease_ms
            self._steps[step_id] = replace(step, lease_expires_at=expires, updated_at=now)
            if lease_ms is not None:
                self._count_renewal(step_id, attempt, now)
            return True

    def _count_renewal(self, step_id: str, attempt: int, now: int) -> None:
        attempts = self._attempts.get(step_id, [])
        for i, found in enumerate(attempts):
            if found.attempt == attempt:
                attempts[i] = replace(found, renewals=found.renewals + 1, renewed_at=now)

    def _fenced(self, step_id: str, attempt: int, claim_id: str | None) -> StepState:
        step = self._steps.get(step_id)
        if step is None or not fence_holds(step, attempt, claim_id):
            raise superseded(step_id, step, attempt, claim_id)
        return step

    def complete_step(
        self, step_id: str, attempt: int, result: JSON, claim_id: str | None = None
    ) -> None:
        value = normalise(result, f"step {step_id}", "result")
        with self._lock:
            self._complete(self._fenced(step_id, attempt, claim_id), value)

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
    ) -> None:
        err = normalise(error, f"step {step_id}", "error")
        with self._lock:
            self._fail(self._fenced(step_id, attempt, claim_id), err, retry_delay)

    def _fail(
        self, step: StepState, err: ErrorInfo, retry_delay: float | None, now: int | None = None
    ) -> None:
        now = self._clock() if now is None else now
        failed = StepOutcome(step.id, step.attempt, ok=False, error=err, retry_delay=retry_delay)
        self._steps[step.id] = step_after_outcome(step, failed, now)
        self._set_attempt(
            step.id, step.attempt, status=AttemptStatus.FAILED, error=err, finished_at=now
        )

    def expire_step(self, step_id: str, bound_ms: int | None = None) -> bool:
        with self._lock:
            step = self._steps.get(step_id)
            now = self._clock()
            if (
                step is None
                or step.status != StepStatus.RUNNING
                or not lease_lapsed(step.lease_expires_at, now, bound_ms)
                or step.attempt < step.max_attempts
            ):
                return False
            err = lease_expired_error(step.name, step.attempt)
            self._steps[step_id] = step_closed(step, err, now)
            self._set_attempt(
                step_id,
                step.attempt,
                status=AttemptStatus.LEASE_EXPIRED,
                error=err,
                finished_at=now,
            )
            return True

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
    def advance(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        # As the SQL store: read, decide with the lock released (the body is
        # user code), then apply if no pass landed in between, else again.
        while True:
            with self._lock:
                run = self._run(run_id)
                stored = outcome
                if outcome is not None:
                    fenced = self._fenced(outcome.step_id, outcome.attempt, outcome.claim_id)
                    where = f"step {fenced.name!r}"
                    stored = replace(
                        outcome,
                        result=normalise(outcome.result, where, "result"),
                        error=normalise(outcome.error, where, "error"),
                    )
                if run.status.terminal and outcome is None:
                    return AdvanceResult(run=run, steps=[], decision=None)
                now = self._clock()
                steps = self.get_steps(run_id)
                signals = dict(self._signals[run_id])
            if stored is not None:
                steps = [
                    step_after_outcome(s, stored, now) if s.id == stored.step_id else s
                    for s in steps
                ]
            decision = None
            if not run.status.terminal:
                view = RunView(run=run, steps=steps, signals=signals, now=now)
                decision = decide(view)
            with self._lock:
                if self._run(run_id).version != run.version:
                    continue
                saved = None
                if outcome is not None:
                    sid = outcome.step_id
                    saved = (sid, self._steps.get(sid), list(self._attempts.get(sid, [])))
                    self._apply_outcome(outcome, now)
                if decision is None:
                    return AdvanceResult(run=run, steps=[], decision=None)
                try:
                    return self._apply_decision(run, view, decision)
                except BaseException:
                    # As a database would roll back: a pass that fails writes nothing.
                    if saved is not None and saved[1] is not None:
                        self._steps[saved[0]] = saved[1]
                        self._attempts[saved[0]] = saved[2]
                    raise

    def _apply_outcome(self, outcome: StepOutcome, now: int) -> None:
        """The fenced outcome on the pass's clock ``now``, as the pass's view shows it."""
        step = self._fenced(outcome.step_id, outcome.attempt, outcome.claim_id)
        where = f"step {step.name!r}"
        if outcome.ok:
            self._complete(step, normalise(outcome.result, where, "result"), now)
        else:
            self._fail(step, normalise(outcome.error, where, "error"), outcome.retry_delay, now)

    def _apply_decision(self, run: RunState, view: RunView, decision: Decision) -> AdvanceResult:
        # Everything is checked before anything is written: a pass is atomic.
        encoded = encode_decision(run, {s.id: s.name for s in view.steps}, decision)
        now = view.now
        publish: list[StepState] = []
        for enc in encoded.resolutions:
            res = enc.resolution
            step = self._steps[res.step_id]
            if step.settled:
                continue
            result = loads(enc.result)
            error = loads(enc.error)
            self._steps[step.id] = step_resolved(step, res.ok, result, error, now)
            if step.kind == StepKind.CHILD:
                self._set_attempt(
                    step.id,
                    step.attempt,
                    status=AttemptStatus.SUCCEEDED if res.ok else AttemptStatus.FAILED,
                    result=result,
                    error=error,
                    finished_at=now,
                )
        children: list[str] = []
        eager = None
        for enc_step in encoded.steps:
            step = self._insert_step(run, enc_step, now)
            claim = eager_claim_of(decision.eager, enc_step.new)
            if claim is not None:
                step = eager = self._steps[step.id] = step_created_claimed(step, claim, now)
                self._attempts[step.id] = [
                    AttemptState(
                        step.id,
                        step.attempt,
                        AttemptStatus.RUNNING,
                        worker=step.worker,
                        started_at=now,
                        claim_id=step.claim_id,
                        dispatch=EAGER,
                        task_id=None if claim.delivery is None else claim.delivery.task_id,
                        node=None if claim.delivery is None else claim.delivery.node,
                    )
                ]
            elif step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
                publish.append(step)
            if step.child_run_id is not None:
                children.append(step.child_run_id)
        for sid in decision.redispatch:
            step = self._steps[sid]
            self._steps[sid] = replace(step, scheduled_at=now)
            publish.append(self._steps[sid])
        if decision.run_status == RunStatus.CANCELLED:
            self._close_live(run.id, now)
        for child_id in decision.cancel_children:
            child = self._runs.get(child_id)
            if child is not None and not child.status.terminal and not child.cancel_requested:
                self._touch_run(child, cancel_requested=True)
                children.append(child_id)
        parent_to_wake = None
        output, error = loads(encoded.output), loads(encoded.error)
        if decision.run_status is not None and decision.run_status.terminal:
            parent_to_wake = self._settle_parent_step(run, decision, output, error)
        new_run = run_after_pass(run, decision, output, error, now)  # one 'now' per pass
        self._runs[run.id] = new_run
        return AdvanceResult(
            run=new_run,
            steps=publish,
            decision=decision,
            parent_to_wake=parent_to_wake,
            children_to_wake=children,
            eager=eager,
        )

    def _close_live(self, run_id: str, now: int) -> None:
        """A cancelled run's open steps fail and its running attempts end cancelled."""
        err = run_cancelled_error()
        for sid in self._run_steps[run_id]:
            step = self._steps[sid]
            if step.status in (StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING):
                self._steps[sid] = step_closed(step, err, now)
            for row in self._attempts.get(sid, []):
                if row.status == AttemptStatus.RUNNING:
                    self._set_attempt(
                        sid, row.attempt, status=AttemptStatus.CANCELLED, error=err, finished_at=now
                    )

    def _insert_step(self, run: RunState, enc: EncodedStep, now: int) -> StepState:
        new, sid = enc.new, enc.id
        step = step_created(run, enc, now)
        if (
            new.kind != StepKind.VALUE
            and new.status != StepStatus.SUCCEEDED
            and new.child is not None
        ):
            child = replace(
                new.child, parent_run_id=run.id, parent_step_id=sid, depth=run.depth + 1
            )
            self._insert_run(child, loads(enc.child_input))
            step = step_parked_on_child(step, child.id)
            self._attempts[sid] = [
                AttemptState(sid, 1, AttemptStatus.RUNNING, worker=None, started_at=now)
            ]
        self._steps[sid] = step
        self._run_steps[run.id].append(sid)
        return step

    def _settle_parent_step(
        self, run: RunState, decision: Decision, output: JSON, error: ErrorInfo | None
    ) -> str | None:
        if run.parent_run_id is None or run.parent_step_id is None:
            return None
        step = self._steps.get(run.parent_step_id)
        parent = self._runs.get(run.parent_run_id)
        if step is None or parent is None or step.status != StepStatus.RUNNING:
            return None
        if step.child_run_id != run.id:
            return None
        ok, result, error = child_outcome(run.id, replace(decision, output=output, error=error))
        now = self._clock()
        self._steps[step.id] = step_resolved(step, ok, result, error, now)
        self._set_attempt(
            step.id,
            step.attempt,
            status=AttemptStatus.SUCCEEDED if ok else AttemptStatus.FAILED,
            result=result,
            error=error,
            finished_at=now,
        )
        if not parent.status.terminal:
            self._touch_run(parent)
        return parent.id

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
            found = [
                r
                for r in self._runs.values()
                if r.status == RunStatus.RUNNING
                and r.updated_at <= cutoff
                and all(self._steps[s].settled for s in self._run_steps[r.id])
            ]
        found.sort(key=lambda r: r.updated_at)
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
