"""Outcome values every store writes the same way."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import DuplicateStepError, SignalAlreadySentError, StoreError
from ..names import check_name
from ..payload import dumps
from .model import (
    JSON,
    Decision,
    ErrorInfo,
    NewStep,
    RunState,
    RunStatus,
    StepKind,
    StepOutcome,
    StepResolution,
    StepState,
    StepStatus,
    step_id_for,
)

LEASE_BOUND_FACTOR = 2
"""The default fleet bound on leases: this many of the longest lease (or horizon)
the configuration knows, so a lease granted under a longer setting during a
rolling deploy is still trusted, and one set further ahead than that is not."""


def lease_lapsed(lease_expires_at: int | None, now: int, bound_ms: int | None = None) -> bool:
    """Whether a running step's lease no longer protects it.

    Lapsed when it ended, or when it ends further ahead than ``bound_ms``:
    no worker is ever granted that (an edited row), and waiting for it would
    park the run for as long. A NULL lease (a parked step) never lapses.
    """
    if lease_expires_at is None:
        return False
    return lease_expires_at <= now or (bound_ms is not None and lease_expires_at > now + bound_ms)


def check_resent(run_id: str, name: str, sent: object, payload: JSON) -> None:
    """A signal of a name already sent is taken only as a resend of the same
    payload (a client retrying): the first one stays, and a different one is
    refused rather than dropped unseen."""
    if sent != payload:
        raise SignalAlreadySentError(
            f"workflow run {run_id} already has signal {name!r} with another payload; "
            "a signal name is delivered once (send another name for a new value)"
        )


SWEEP_BACKOFF_DOUBLINGS = 16
"""The sweep's per-run backoff doubles at most this many times (then the cap holds)."""


def sweep_backoff_ms(base_ms: int, sweep_count: int, max_ms: int) -> int:
    """The wait before the sweep may wake a run again, after ``sweep_count``
    wake-ups with no pass in between: ``base * 2 ** count``, at most ``max_ms``."""
    doublings: int = min(sweep_count, SWEEP_BACKOFF_DOUBLINGS)
    return min(base_ms * (1 << doublings), max_ms)


def sweep_order(next_sweep_at: int, own_ms: int, now: int) -> int | None:
    """Where a step stands in the sweep's order, or None while its backoff runs.

    A step never re-sent stands at its own time (its lease's end, when its
    message was sent, when it came due); one re-sent stands at the end of its
    backoff, behind what has waited longer, so re-sending it again and again
    can never keep another step out of a batch.
    """
    if next_sweep_at == 0:  # never re-sent
        return own_ms
    return next_sweep_at if next_sweep_at <= now else None


def lease_expired_error(step_name: str, attempts: int) -> ErrorInfo:
    """The error a step gets when its worker was lost on its last attempt."""
    return {
        "type": "WorkflowStepLeaseExpiredError",
        "message": (
            f"step {step_name!r} lost its worker (lease lapsed) on each of its "
            f"{attempts} attempt(s)"
        ),
        "traceback": "",
    }


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


@dataclass(frozen=True)
class EncodedStep:
    """A new step with its payloads already serialised."""

    new: NewStep
    id: str
    args: str
    kwargs: str
    value: str | None  # steps recorded as succeeded (values, signals): their result
    child_input: str | None  # CHILD steps: the child run's input


@dataclass(frozen=True)
class EncodedResolution:
    """A step resolution with its result or error already serialised."""

    resolution: StepResolution
    result: str | None
    error: str | None


@dataclass(frozen=True)
class EncodedDecision:
    """A decision checked in full before the store writes any of it.

    Checking first keeps a pass atomic: a non-JSON value or a duplicate step
    name is refused with nothing written, in every store.
    """

    steps: list[EncodedStep]
    resolutions: list[EncodedResolution]
    output: str | None  # set only when the run ends
    error: str | None


def encode_decision(
    run: RunState, step_names: dict[str, str], decision: Decision
) -> EncodedDecision:
    """Serialise every payload of ``decision`` and refuse duplicate step names.

    ``step_names`` maps the run's recorded step ids to their names.
    """
    taken = set(step_names.values())
    steps: list[EncodedStep] = []
    for new in decision.new_steps:
        check_name(new.name, f"workflow run {run.id}: step name")
        if new.task_name is not None:
            check_name(new.task_name, f"step {new.name!r}: task name")
        if new.queue is not None:
            check_name(new.queue, f"step {new.name!r}: queue")
        if new.name in taken:
            raise DuplicateStepError(f"workflow run {run.id} already has a step {new.name!r}")
        taken.add(new.name)
        where = f"step {new.name!r}"
        steps.append(
            EncodedStep(
                new=new,
                id=step_id_for(run.id, new.name),
                args=dumps(new.args, where, "args"),
                kwargs=dumps(new.kwargs, where, "kwargs"),
                value=(
                    dumps(new.result, where, "result")
                    if new.kind == StepKind.VALUE or new.status == StepStatus.SUCCEEDED
                    else None
                ),
                child_input=(
                    dumps(new.child.input, where, "child input")
                    if new.child is not None and new.kind != StepKind.VALUE
                    else None
                ),
            )
        )
    for sid in [r.step_id for r in decision.resolutions] + list(decision.redispatch):
        if sid not in step_names:
            raise StoreError(f"workflow run {run.id} has no step {sid}")
    resolutions: list[EncodedResolution] = []
    for res in decision.resolutions:
        where = f"step {step_names.get(res.step_id, res.step_id)!r}"
        resolutions.append(
            EncodedResolution(
                resolution=res,
                result=dumps(res.result, where, "result") if res.ok else None,
                error=None if res.ok or res.error is None else dumps(res.error, where, "error"),
            )
        )
    terminal = decision.run_status is not None and decision.run_status.terminal
    where = f"workflow {run.workflow!r}"
    return EncodedDecision(
        steps=steps,
        resolutions=resolutions,
        output=dumps(decision.output, where, "output") if terminal else None,
        error=(
            dumps(decision.error, where, "error")
            if terminal and decision.error is not None
            else None
        ),
    )
