"""What one replay pass has reached and records: the base of :class:`~.context.Context`.

Each ctx call reaches a step by name, in order: the checks that a replay
reaches the steps its run recorded, in the same order and under unique names,
live here, with the pass's budget (calls and time) and the decision the pass
builds (new steps, resolutions, wake times). The body's API is
:class:`~.context.Context`, built on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from ..errors import UnknownPatchError, WorkflowLimitError, WorkflowNondeterminismError
from ..model.values import (
    JSON,
    Decision,
    NewStep,
    RunView,
    StepKind,
    StepResolution,
    StepState,
    StepStatus,
    step_id_for,
)
from ..names import PATCH_PREFIX, check_name
from .limits import Limits, PassBudgetSpent

if TYPE_CHECKING:
    from .workflow import Workflow

# What a joined handle gives: Any for a task step (a Celery task's result type
# is unknown, and it comes back through JSON), the child workflow's output
# type for a child step. Covariant, so handles of different types gather into
# a list of their join; a bare ``StepHandle`` is ``StepHandle[Any]``.
Value = TypeVar("Value", covariant=True, default=Any)


class Suspend(BaseException):
    """Ends a pass: the run waits for something in flight."""


@dataclass
class StepHandle(Generic[Value]):
    """A step put in flight by ``step_async``/``child_async``; join with ``gather``.

    ``Value`` is what ``gather`` returns for it (only the type checker sees it).
    """

    name: str


@dataclass
class PassState:
    """What one pass has reached so far, and the decision it builds."""

    decision: Decision = field(default_factory=Decision)
    reached: dict[str, int] = field(default_factory=dict)  # step name -> its index
    now_reached: int = 0  # names reached starting "now#": the next ctx.now()'s number
    in_flight_wakes: list[int] = field(default_factory=list)
    patches: dict[str, bool] = field(default_factory=dict)  # ctx.patched's answers
    events: dict[str, int] = field(default_factory=dict)  # event key -> events reached


class PassRecord:
    """The run's recorded steps, and what this pass reached and records."""

    def __init__(
        self,
        view: RunView,
        resolve_task: Callable[[Any], str],
        task_queue: Callable[..., str | None],
        lookup_workflow: Callable[[str | Workflow[Any, Any]], Workflow[Any, Any]],
        limits: Limits | None = None,
    ) -> None:
        self._view = view
        self._recorded = sorted(view.steps, key=lambda s: s.seq)
        self._by_name = {s.name: s for s in self._recorded}
        self._resolve_task = resolve_task
        self._task_queue = task_queue
        self._lookup_workflow = lookup_workflow
        self._pass = PassState()
        self._settled_now: dict[str, StepState] = {}
        self._limits = limits or Limits()
        self._calls = 0
        self._deadline = time.monotonic() + self._limits.pass_max_seconds
        self._children = sum(1 for s in self._recorded if s.kind == StepKind.CHILD)

    def _spend(self) -> None:
        """Count one ctx call against the pass's budget (calls and time)."""
        self._calls += 1
        limits = self._limits
        if self._calls > limits.pass_max_calls:
            raise PassBudgetSpent(
                f"the pass of run {self._view.run.id} made more than {limits.pass_max_calls} ctx "
                "calls without suspending (pass_max_calls); a body must wait on a step, "
                "timer or signal to make progress"
            )
        if time.monotonic() > self._deadline:
            raise PassBudgetSpent(
                f"the pass of run {self._view.run.id} ran longer than {limits.pass_max_seconds} s "
                "(pass_max_seconds); a body replays in milliseconds unless it loops or "
                "does work that belongs in a step"
            )

    def _reach(self, name: str, kind: StepKind) -> StepState | None:
        """Check order and uniqueness; return the recorded step, if any."""
        self._spend()
        reached = self._pass.reached
        index = len(reached)
        recorded = self._recorded[index] if index < len(self._recorded) else None
        if recorded is None or recorded.name != name:
            # A replayed step's name was checked when it was recorded, and is
            # unique in its run; only a new (or diverging) name is checked.
            check_name(name, "step name")
            if name in reached:
                raise WorkflowNondeterminismError(
                    f"step name {name!r} is used twice in run {self._view.run.id} "
                    f"(as step #{reached[name]} and step #{index}, numbered from 0 as "
                    "in runs show); "
                    "step names must be unique within a run",
                    index=index,
                    reached=(kind.value, name),
                )
        reached[name] = index
        if name.startswith("now#"):
            self._pass.now_reached += 1
        if recorded is not None:
            if recorded.name != name or recorded.kind != kind:
                where = (
                    f"replay of run {self._view.run.id} reached {kind.value} step {name!r} as step "
                    f"#{index} (numbered from 0 as in runs show), but step #{index} was "
                    f"recorded as {recorded.kind.value} step {recorded.name!r}"
                )
                fields: dict[str, Any] = {
                    "index": index,
                    "reached": (kind.value, name),
                    "recorded": (recorded.kind.value, recorded.name),
                }
                if recorded.kind == StepKind.VALUE and recorded.name.startswith(PATCH_PREFIX):
                    raise UnknownPatchError(
                        f"{where}, the marker of a ctx.patched this code never asks for "
                        "there: newer code made the run, or the patch call was removed "
                        "while runs hold it; left for a worker whose code knows the patch",
                        **fields,
                    )
                raise WorkflowNondeterminismError(
                    f"{where}; the workflow body must reach steps in the same order on "
                    "every replay",
                    **fields,
                )
            return self._settled_now.get(name, recorded)
        return None

    def _record(self, new: NewStep) -> None:
        seq = len(self._pass.reached) - 1
        if seq >= self._limits.max_steps_per_run:
            raise WorkflowLimitError(
                f"step {new.name!r} would be step {seq + 1} of run {self._view.run.id}, above the "
                f"limit of {self._limits.max_steps_per_run} (max_steps_per_run); a run "
                "that goes on for ever ends with ctx.continue_as_new(input), which starts "
                "a new run of its workflow with an empty history"
            )
        self._pass.decision.new_steps.append(replace(new, seq=seq))
        if new.status in (StepStatus.SUCCEEDED,):
            # Settled on record: later calls in this pass may read it.
            self._settled_now[new.name] = StepState(
                id=step_id_for(self._view.run.id, new.name),
                run_id=self._view.run.id,
                name=new.name,
                seq=seq,
                kind=new.kind,
                status=new.status,
                result=new.result,
            )

    def _current(self, name: str) -> StepState | None:
        if name in self._settled_now:
            return self._settled_now[name]
        return self._by_name.get(name)

    def _resolve(
        self, step: StepState, *, ok: bool, result: JSON = None, error: dict[str, Any] | None = None
    ) -> None:
        self._pass.decision.resolutions.append(StepResolution(step.id, ok, result, error))
        self._settled_now[step.name] = replace(
            step,
            status=StepStatus.SUCCEEDED if ok else StepStatus.FAILED,
            result=result,
            error=error,
            wake_at=None,
        )


def pass_state(ctx: PassRecord) -> tuple[Decision, Sequence[int]]:
    """The decision a finished pass produced, and the wake times it waits on."""
    return ctx._pass.decision, ctx._pass.in_flight_wakes
