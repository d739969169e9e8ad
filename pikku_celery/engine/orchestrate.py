"""Orchestration passes: apply an outcome, replay, publish after commit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, LeaseTakenError, WorkflowStepSupersededError
from ..lease import hold_lease
from ..store.model import AdvanceResult, Decision, RunView, StepOutcome
from .replay import replay

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

REWAKE_SECONDS = 1.0


def run_lease_key(run_id: str) -> str:
    """The lease key of a run's orchestration pass: one pass per run at a time."""
    return f"workflow-run:{run_id}"


def advance(
    engine: WorkflowEngine, run_id: str, outcome: StepOutcome | None, reason: str = ""
) -> AdvanceResult | None:
    """One pass in one transaction, then its messages. None if superseded."""
    previous_wake: list[int | None] = []

    def decide(view: RunView) -> Decision:
        previous_wake.append(view.run.wake_at)
        workflow = engine.registry.get(view.run.workflow)
        return replay(
            workflow,
            view,
            engine.dispatcher.task_name,
            engine.dispatcher.task_queue,
            engine.registry.get,
        )

    try:
        result = engine.store.advance(run_id, outcome, decide)
    except WorkflowStepSupersededError as exc:
        log.warning("refused a superseded outcome: %s", exc)
        return None
    publish(engine, result, previous_wake[0] if previous_wake else None, reason)
    return result


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


def orchestrate(engine: WorkflowEngine, run_id: str, reason: str = "") -> None:
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
