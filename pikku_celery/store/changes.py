"""Every state change of a run or step, once, as a pure function.

The memory store applies them to its dicts; the SQL store's statements
write the same change in SQL, and the run and steps a SQL pass hands back
(and keeps for the next pass) are these functions' results, so they equal
what the written rows read back as. The conformance suite holds the two
stores to each other. (An outcome's change is
:func:`.rules.step_after_outcome`; a cancelled run's open step,
:func:`.rules.step_closed`.)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from ..errors import WorkflowStepSupersededError
from ..payload import dumps, loads, normalise
from .model import (
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
from .rules import EncodedStep, step_after_outcome


def run_created(new: NewRun, value: JSON, now: int) -> RunState:
    """A new run with input ``value`` (as stored), created at ``now``."""
    return RunState(
        id=new.id,
        workflow=new.workflow,
        status=RunStatus.RUNNING,
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
    )


@dataclass(frozen=True)
class PreparedOutcome:
    """A step outcome checked against the steps read, ready to write."""

    kind: str  # one of OUTCOMES
    params: dict[str, Any]  # binds of the fenced write
    steps: list[StepState]  # the run's steps as they are once it lands


def prepare_outcome(steps: list[StepState], outcome: StepOutcome, now: int) -> PreparedOutcome:
    """Check the fence against the steps read and serialise the payload,
    before anything is written (the write itself is fenced again)."""
    index = next((i for i, s in enumerate(steps) if s.id == outcome.step_id), None)
    step = None if index is None else steps[index]
    if step is not None and not fence_holds(step, outcome.attempt, outcome.claim_id):
        raise superseded(outcome.step_id, step, outcome.attempt, outcome.claim_id)
    where = f"step {step.name!r}" if step is not None else f"step {outcome.step_id}"
    params: dict[str, Any] = {
        "p_id": outcome.step_id,
        "p_attempt": outcome.attempt,
        "p_claim": outcome.claim_id,
        "p_now": now,
    }
    if outcome.ok:
        params["p_result"] = text = dumps(outcome.result, where, "result")
        kind = "complete"
    else:
        params["p_error"] = text = dumps(outcome.error, where, "error")
        retry = outcome.retry_delay
        params["p_delay_ms"] = None if retry is None else round(retry * 1000)
        kind = "fail" if retry is None else "fail_retry"
    if step is None or index is None:
        return PreparedOutcome(kind, params, steps)
    # The step as the write leaves it, with the payload as it will read back.
    stored = (
        replace(outcome, result=json.loads(text))
        if outcome.ok
        else replace(outcome, error=json.loads(text))
    )
    done = step_after_outcome(step, stored, now)
    return PreparedOutcome(kind, params, [*steps[:index], done, *steps[index + 1 :]])


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
