"""A pass's decision checked and serialised in full before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DuplicateStepError, StoreError
from ..names import check_name
from ..payload import dumps
from .values import (
    Decision,
    NewStep,
    RunState,
    StepIndex,
    StepKind,
    StepResolution,
    StepStatus,
    step_id_for,
)


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


def encode_decision(run: RunState, recorded: StepIndex, decision: Decision) -> EncodedDecision:
    """Serialise every payload of ``decision`` and refuse duplicate step names.

    ``recorded`` holds the run's recorded steps by id and by name.
    """
    taken: set[str] = set()  # the decision's own new names
    steps: list[EncodedStep] = []
    for new in decision.new_steps:
        check_name(new.name, f"workflow run {run.id}: step name")
        if new.task_name is not None:
            check_name(new.task_name, f"step {new.name!r}: task name")
        if new.queue is not None:
            check_name(new.queue, f"step {new.name!r}: queue")
        if new.name in taken or new.name in recorded.by_name:
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
        if sid not in recorded.by_id:
            raise StoreError(f"workflow run {run.id} has no step {sid}")
    resolutions: list[EncodedResolution] = []
    for res in decision.resolutions:
        known = recorded.by_id.get(res.step_id)
        name = res.step_id if known is None else known.name
        where = f"step {name!r}"
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
