"""What a pass's writes leave behind, as pure functions of the rows it read.

The SQL store's passes decide outside any transaction and then write; the
run and steps they hand back (and keep for the next pass) are these
functions' results, the same state the written rows read back as.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from ..errors import WorkflowStepSupersededError
from ..payload import dumps, loads
from .model import NewRun, RunState, RunStatus, StepKind, StepOutcome, StepState, StepStatus
from .rules import EncodedStep, step_after_outcome


def new_run_state(new: NewRun, input_text: str, now: int) -> RunState:
    """A new run as its insert leaves it."""
    return RunState(
        id=new.id,
        workflow=new.workflow,
        status=RunStatus.RUNNING,
        input=json.loads(input_text),
        idempotency_key=new.idempotency_key,
        parent_run_id=new.parent_run_id,
        parent_step_id=new.parent_step_id,
        version=1,
        created_at=now,
        updated_at=now,
        depth=new.depth,
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
    if step is not None and (step.status != StepStatus.RUNNING or step.attempt != outcome.attempt):
        raise WorkflowStepSupersededError(outcome.step_id, outcome.attempt)
    where = f"step {step.name!r}" if step is not None else f"step {outcome.step_id}"
    params: dict[str, Any] = {"p_id": outcome.step_id, "p_attempt": outcome.attempt, "p_now": now}
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


def new_step_state(run: RunState, enc: EncodedStep, now: int) -> StepState:
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
        route=new.route,
    )
    if new.kind == StepKind.VALUE or new.status == StepStatus.SUCCEEDED:
        step = replace(step, status=StepStatus.SUCCEEDED, result=loads(enc.value))
    return step
