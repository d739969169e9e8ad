"""Orchestration passes: apply an outcome, replay, publish after commit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import (
    LeaseLostError,
    LeaseTakenError,
    PikkuError,
    RunNotFoundError,
    UnknownWorkflowError,
    WorkflowStepSupersededError,
)
from ..lease import hold_lease
from ..model.plan import PassView
from ..model.values import AdvanceResult, Decision, NewRun, RunStatus, RunView, StepOutcome
from .blocked import rewake_blocked
from .choose import bodies_for, replay_on
from .concurrency import left, queued_wakeup
from .deadline import overdue, timed_out, wake_by_deadline
from .observe import Carrier
from .passes import start_pass, take_pass
from .readable import check_readable as check_readable  # the deploy check's too
from .replay import cancelled, error_info
from .resume import forget

if TYPE_CHECKING:
    from .core import WorkflowEngine
    from .eager import EagerOffer

log = logging.getLogger(__name__)

REWAKE_SECONDS = 1.0


def run_lease_key(run_id: str) -> str:
    """The lease key of a run's orchestration pass: one pass per run at a time."""
    return f"workflow-run:{run_id}"


def advance(
    engine: WorkflowEngine,
    run_id: str,
    outcome: StepOutcome | None,
    reason: str = "",
    offer: EagerOffer | None = None,
    start: NewRun | None = None,
    known: PassView | None = None,
) -> AdvanceResult | None:
    """One pass in one transaction, then its messages. None if superseded.

    With ``offer``, one new step this worker can run now is written claimed by it
    instead of published (``AdvanceResult.eager``), unless the workflow opts out of
    eager steps. With ``start``, the run ``start`` is created by this pass (in one
    write where the store can). ``known``: the run as ``outcome``'s claim saw it.

    A pass that cannot be decided or stored for a reason every replay would
    meet again (a name no database stores, an unreadable stored value, a
    bound passed) fails the run once with that error, keeping ``outcome``:
    what was already decided is never lost, and the run is not retried forever.
    """
    previous_wake: list[int | None] = []
    unknown: list[UnknownWorkflowError] = []

    def decide(view: RunView) -> Decision:
        previous_wake.append(view.run.wake_at)
        if view.run.cancel_requested:
            return cancelled(view)  # even a run whose workflow or values are unreadable
        if overdue(view):
            return timed_out(view)  # the same: its deadline does not wait for its code
        try:
            bodies = bodies_for(engine, view)
            workflow, decision = replay_on(engine, bodies, view)
        except UnknownWorkflowError as exc:
            if outcome is None:
                raise
            # The step's work is done: keep its outcome, decide nothing.
            unknown.append(exc)
            return Decision()
        if offer is not None and workflow.eager_steps:
            decision = offer.choose(decision)
        return wake_by_deadline(view, decision)

    result: AdvanceResult | None = None
    store, runs = engine.store, engine.known_runs
    try:
        if start is not None:
            result = start_pass(store, engine.capabilities.starts, start, decide, runs)
        else:
            result = take_pass(store, run_id, outcome, decide, known, runs)
    except WorkflowStepSupersededError as exc:
        log.warning("refused a superseded outcome: %s", exc)
        engine.observers.write_refused(exc.step_id, exc.attempt, exc.claim_lost)
        return None
    except RunNotFoundError:
        raise  # nothing to fail
    except UnknownWorkflowError as exc:
        # Another worker (a newer deploy) may know it: wait for it, visibly.
        engine.store.mark_blocked(run_id, str(exc))
        rewake_blocked(engine, run_id, reason)
        raise
    except (PikkuError, ValueError, TypeError) as exc:
        # Pikku's own refusals, a value no database stores, a body or codec
        # bug: the same on every replay. Anything else (a lost connection, a
        # worker interrupted) is retried by the caller or the sweep.
        if engine.is_transient(exc):
            raise
        result = _fail_run(engine, run_id, outcome, exc)
        if result is None:
            return None
    if unknown:
        engine.store.mark_blocked(run_id, str(unknown[-1]))
        log.warning("run %s: step outcome kept, run left blocked: %s", run_id, unknown[-1])
    publish(engine, result, previous_wake[0] if previous_wake else None, reason)
    if result.decision is not None and result.run.status.terminal:
        left(engine, result.run)  # its concurrency slot, if it holds one
        forget(run_id)  # a body parked here (a cancel or a deadline ends it unresumed)
    if engine.observers and result.decision is not None and result.run.status.terminal:
        engine.observers.run_settled(result.run)
    return result


def _fail_run(
    engine: WorkflowEngine, run_id: str, outcome: StepOutcome | None, exc: Exception
) -> AdvanceResult | None:
    """The pass that failed, taken again as "the run failed with ``exc``"."""
    log.error("workflow run %s: its pass cannot be recorded; failing the run: %r", run_id, exc)
    error = error_info(exc)
    error["message"] = f"the pass of run {run_id} could not be recorded: {error['message']}"

    def fail(view: RunView) -> Decision:
        if view.run.cancel_requested:
            return cancelled(view)
        return Decision(run_status=RunStatus.FAILED, error=error)

    try:
        return take_pass(engine.store, run_id, outcome, fail)
    except WorkflowStepSupersededError as superseded:
        log.warning("refused a superseded outcome: %s", superseded)
        engine.observers.write_refused(
            superseded.step_id, superseded.attempt, superseded.claim_lost
        )
        return None


def publish(
    engine: WorkflowEngine, result: AdvanceResult, previous_wake: int | None, reason: str
) -> None:
    """Send what the committed pass decided. A crash before this is repaired
    by the sweep (a scheduled step with no message, a due timer)."""
    dispatcher = engine.dispatcher
    now = result.run.updated_at
    for step in result.steps:
        countdown = max(0.0, (step.wake_at - now) / 1000) if step.wake_at else 0.0
        if countdown <= dispatcher.max_countdown(step.queue):
            dispatcher.send_step(step, countdown)
    for child_id in result.children_to_wake:
        dispatcher.wake_run(child_id, reason="child")
    if result.parent_to_wake:
        dispatcher.wake_run(result.parent_to_wake, reason="child-ended")
    decision = result.decision
    if decision is None or decision.wake_at is None or result.run.status.terminal:
        return
    if decision.wake_at == previous_wake and reason != "timer":
        return  # a wake-up for this timer is already on its way
    delay = max(0.0, (decision.wake_at - now) / 1000)
    if delay <= dispatcher.max_countdown(engine.orchestration_queue):
        dispatcher.wake_run(result.run.id, countdown=delay, reason="timer")


def orchestrate(
    engine: WorkflowEngine, run_id: str, reason: str = "", trace: Carrier | None = None
) -> None:
    """The orchestrate task: a pass under the run lease ``workflow-run:<id>``.

    A settled run returns at once. If another worker holds the run, the run is
    woken again ~1 s later rather than failing or spending a retry.
    """
    run = engine.store.get_run(run_id)
    if run is None:
        log.warning("orchestrate: no workflow run %s", run_id)
        return
    if run.status.terminal:
        return
    if run.status == RunStatus.QUEUED:
        queued_wakeup(engine, run)  # nothing runs before its key admits it
        return
    with engine.observers.passing(run, reason, trace):
        try:
            with hold_lease(
                engine.leases, run_lease_key(run_id), engine.run_lease_ttl, holder=engine.worker_id
            ):
                advance(engine, run_id, None, reason)
        except LeaseTakenError:
            engine.dispatcher.wake_run(run_id, countdown=REWAKE_SECONDS, reason=reason)
        except LeaseLostError as exc:
            # The pass itself was serialised by its transaction; only log.
            log.warning("run %s: %s", run_id, exc)
