"""Every state change of a run or step, once, as a pure function.

The memory store applies them to its dicts; the SQL store's statements
write the same change in SQL, and the run and steps a SQL pass hands back
(and keeps for the next pass) are these functions' results, so they equal
what the written rows read back as. The conformance suite holds the two
stores to each other.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from ..errors import WorkflowStepSupersededError
from ..payload import loads, normalise
from .encode import EncodedStep
from .values import (
    JSON,
    Decision,
    EagerClaim,
    ErrorInfo,
    NewRun,
    NewStep,
    RunState,
    RunStatus,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)


def run_created(new: NewRun, value: JSON, now: int) -> RunState:
    """A new run with input ``value`` (as stored), created at ``now``."""
    return RunState(
        id=new.id,
        workflow=new.workflow,
        status=new.status,
        input=value,
        idempotency_key=new.idempotency_key,
        parent_run_id=new.parent_run_id,
        parent_step_id=new.parent_step_id,
        version=1,
        created_at=now,
        updated_at=now,
        depth=new.depth,
        workflow_version=new.workflow_version,
        trace_context=new.trace_context,
        deadline_at=None if new.timeout_ms is None else now + new.timeout_ms,
        continued_from=new.continued_from,
    )


def step_created(run: RunState, enc: EncodedStep, now: int) -> StepState:
    """A new step as the pass records it (before any child-run parking)."""
    new = enc.new
    step = StepState(
        id=enc.id,
        run_id=run.id,
        name=new.name,
        seq=new.seq,
        kind=new.kind,
        status=new.status,
        task_name=new.task_name,
        queue=new.queue,
        args=json.loads(enc.args),
        kwargs=json.loads(enc.kwargs),
        max_attempts=new.max_attempts,
        retry_delay=new.retry_delay,
        backoff=new.backoff,
        wake_at=new.wake_at,
        scheduled_at=now if new.status == StepStatus.SCHEDULED else None,
        created_at=now,
        updated_at=now,
        route=None if new.route is None else normalise(new.route, new.name, "route"),
        timeout_ms=new.timeout_ms,
    )
    if new.kind == StepKind.VALUE or new.status == StepStatus.SUCCEEDED:
        step = replace(step, status=StepStatus.SUCCEEDED, result=loads(enc.value))
    return step


def new_claim_id() -> str:
    """A claim's random id: no two claims of a step share one, whatever the
    database forgot."""
    return os.urandom(16).hex()


def step_claimed(step: StepState, worker: str, lease_ms: int, now: int, claim_id: str) -> StepState:
    """A step as a claim leaves it: running as its next attempt, under a lease
    on the store's clock, with the claim's id."""
    return replace(
        step,
        status=StepStatus.RUNNING,
        attempt=step.attempt + 1,
        lease_expires_at=now + lease_ms,
        wake_at=None,
        worker=worker,
        result=None,
        error=None,
        updated_at=now,
        claim_id=claim_id,
    )


def step_created_claimed(step: StepState, claim: EagerClaim, now: int) -> StepState:
    """A new step as an eager pass writes it: claimed by the passing worker
    as its first attempt, never waiting in a queue."""
    claimed = step_claimed(step, claim.worker, claim.lease_ms, now, claim.claim_id)
    return replace(claimed, scheduled_at=now)


def eager_claim_of(claim: EagerClaim | None, new: NewStep) -> EagerClaim | None:
    """The pass's eager claim if ``new`` is the step it names (a task step only)."""
    if claim is None or claim.step_name != new.name or new.kind != StepKind.TASK:
        return None
    return claim


def fence_holds(step: StepState | None, attempt: int, claim_id: str | None) -> bool:
    """Whether a write of ``attempt`` under claim ``claim_id`` may land on
    ``step`` (rules 2 and 3): it runs that attempt under that claim (a None
    claim: any)."""
    return (
        step is not None
        and step.status == StepStatus.RUNNING
        and step.attempt == attempt
        and (claim_id is None or step.claim_id == claim_id)
    )


def superseded(
    step_id: str, step: StepState | None, attempt: int, claim_id: str | None
) -> WorkflowStepSupersededError:
    """The refusal of a write whose fence did not hold, saying whether only
    the claim id differed (a claim the database lost)."""
    claim_lost = (
        step is not None
        and step.attempt == attempt
        and claim_id is not None
        and step.claim_id != claim_id
    )
    return WorkflowStepSupersededError(step_id, attempt, claim_lost)


def step_parked_on_child(step: StepState, child_run_id: str) -> StepState:
    """A child step as its child run starts: running, attempt 1, no lease (no
    worker holds it; the child's end settles it)."""
    return replace(
        step, status=StepStatus.RUNNING, attempt=1, lease_expires_at=None, child_run_id=child_run_id
    )


def step_resolved(
    step: StepState, ok: bool, result: JSON, error: ErrorInfo | None, now: int
) -> StepState:
    """A step the pass settles itself (a timer fired, a signal came, a child ended)."""
    return replace(
        step,
        status=StepStatus.SUCCEEDED if ok else StepStatus.FAILED,
        result=result,
        error=error,
        lease_expires_at=None,
        wake_at=None,
        updated_at=now,
    )


def run_after_pass(
    run: RunState, decision: Decision, output: JSON, error: ErrorInfo | None, now: int
) -> RunState:
    """The run as a pass leaves it: a new version, the next wake-up, the
    sweep's backoff and any block cleared; ended, with its outcome."""
    ends = decision.run_status is not None and decision.run_status.terminal
    run = replace(
        run,
        version=run.version + 1,
        updated_at=now,
        wake_at=None if ends else decision.wake_at,
        next_sweep_at=None,
        sweep_count=0,
        blocked=None,
    )
    if ends:
        assert decision.run_status is not None
        run = replace(run, status=decision.run_status, output=output, error=error)
    return run


def step_after_outcome(step: StepState, outcome: StepOutcome, now: int) -> StepState:
    """A running step as a fenced outcome leaves it (the caller checked the fence).

    A failure with a ``retry_delay`` and attempts left waits (``wake_at``)
    for its next attempt; any other failure is final.
    """
    if outcome.ok:
        return replace(
            step,
            status=StepStatus.SUCCEEDED,
            result=outcome.result,
            error=None,
            lease_expires_at=None,
            wake_at=None,
            updated_at=now,
        )
    delay = outcome.retry_delay
    retry = delay is not None and step.attempt < step.max_attempts
    return replace(
        step,
        status=StepStatus.FAILED,
        error=outcome.error,
        result=None,
        lease_expires_at=None,
        wake_at=now + round((delay or 0) * 1000) if retry else None,
        scheduled_at=None,  # the next attempt's message is not sent yet
        updated_at=now,
    )


def step_closed(step: StepState, error: ErrorInfo, now: int) -> StepState:
    """A step failed for good without an outcome of its own (its lease
    expired on its last attempt, its run was cancelled): no lease, no retry."""
    return replace(
        step,
        status=StepStatus.FAILED,
        error=error,
        lease_expires_at=None,
        wake_at=None,
        updated_at=now,
    )


def run_cancelled_error() -> ErrorInfo:
    """The error a cancelled run's still-open steps and attempts are closed with."""
    return {
        "type": "WorkflowCancelledError",
        "message": "its workflow run was cancelled",
        "traceback": "",
    }


def child_outcome(child_run_id: str, decision: Decision) -> tuple[bool, JSON, ErrorInfo | None]:
    """What a parent's child step records when the child run ends."""
    if decision.run_status == RunStatus.COMPLETED:
        return True, decision.output, None
    if decision.run_status == RunStatus.CANCELLED:
        return (
            False,
            None,
            {
                "type": "WorkflowCancelledError",
                "message": f"child workflow run {child_run_id} was cancelled",
                "traceback": "",
            },
        )
    err = dict(decision.error or {})
    err.setdefault("type", "WorkflowFailedError")
    err["message"] = f"child workflow run {child_run_id} failed: {err.get('message', '')}"
    return False, None, err
