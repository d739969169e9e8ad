"""``Context``: what a workflow body calls during one replay pass.

The body is re-run from the top on every pass. Each call either returns what
is recorded, records something new for the store to apply, or suspends the
pass (a :class:`Suspend` that user code cannot swallow with ``except
Exception``) because the run has to wait.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Literal, overload

from typing_extensions import TypeVar

from ..errors import (
    SignalTimeoutError,
    StepFailedError,
    UnknownPatchError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
)
from ..names import (
    MAX_PATCH_ID_LENGTH,
    MAX_SIGNAL_NAME_LENGTH,
    PATCH_PREFIX,
    SIGNAL_PREFIX,
    check_name,
)
from ..payload import check_json
from ..store.model import (
    JSON,
    Decision,
    NewRun,
    NewStep,
    RunView,
    StepKind,
    StepResolution,
    StepState,
    StepStatus,
    step_id_for,
)
from .limits import Limits, PassBudgetSpent

if TYPE_CHECKING:
    from .workflow import Workflow

# What a joined handle gives: Any for a task step (a Celery task's result type
# is unknown, and it comes back through JSON), the child workflow's output
# type for a child step. Covariant, so handles of different types gather into
# a list of their join; a bare ``StepHandle`` is ``StepHandle[Any]``.
Value = TypeVar("Value", covariant=True, default=Any)
_T = TypeVar("_T")
_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Suspend(BaseException):
    """Ends a pass: the run waits for something in flight."""


@dataclass
class StepHandle(Generic[Value]):
    """A step put in flight by ``step_async``/``child_async``; join with ``gather``.

    ``Value`` is what ``gather`` returns for it (only the type checker sees it).
    """

    name: str


@dataclass
class _PassState:
    decision: Decision = field(default_factory=Decision)
    reached: dict[str, int] = field(default_factory=dict)  # step name -> its index
    now_reached: int = 0  # names reached starting "now#": the next ctx.now()'s number
    in_flight_wakes: list[int] = field(default_factory=list)
    patches: dict[str, bool] = field(default_factory=dict)  # ctx.patched's answers


def _seconds(value: float | timedelta) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, got {value!r}")
    return seconds


class Context:
    """The workflow body's handle on its run."""

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
        self._pass = _PassState()
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
                f"the pass of run {self.run_id} made more than {limits.pass_max_calls} ctx "
                "calls without suspending (pass_max_calls); a body must wait on a step, "
                "timer or signal to make progress"
            )
        if time.monotonic() > self._deadline:
            raise PassBudgetSpent(
                f"the pass of run {self.run_id} ran longer than {limits.pass_max_seconds} s "
                "(pass_max_seconds); a body replays in milliseconds unless it loops or "
                "does work that belongs in a step"
            )

    # --- identity and time ---------------------------------------------------
    @property
    def run_id(self) -> str:
        """The id of the run this body is replaying."""
        return self._view.run.id

    @property
    def input(self) -> JSON:
        """The run's input, as given to ``start``."""
        return self._view.run.input

    def idempotency_key(self, step_name: str) -> str:
        """A stable key for the step's external side effects (payment APIs)."""
        return step_id_for(self.run_id, step_name)

    def now(self) -> datetime:
        """The store's time, recorded on first reach so replays see the same."""
        name = f"now#{self._pass.now_reached}"
        step = self._reach(name, StepKind.VALUE)
        if step is not None:
            return datetime.fromtimestamp(int(step.result) / 1000, tz=UTC)
        self._record(NewStep(name, 0, StepKind.VALUE, StepStatus.SUCCEEDED, result=self._view.now))
        return datetime.fromtimestamp(self._view.now / 1000, tz=UTC)

    # --- changing a body that has runs in flight -------------------------------
    def patched(self, change_id: str) -> bool:
        """Whether this run takes the new code path of change ``change_id``.

        True for a run that reaches this point under the changed body: the
        first time, a marker (the value step ``patch:<change_id>``) is
        recorded in its history, so every replay says True again. False for
        a run that passed this point before the change (its history has
        another step here): it keeps to the old path, replay after replay.
        Called again in the same run, it answers as it first did.
        """
        check_name(change_id, "patch id", MAX_PATCH_ID_LENGTH)
        known = self._pass.patches.get(change_id)
        if known is not None:
            self._spend()
            return known
        name = PATCH_PREFIX + change_id
        index = len(self._pass.reached)
        recorded = self._recorded[index] if index < len(self._recorded) else None
        if recorded is not None and not _is_marker(recorded, name):
            self._spend()  # the run passed here before the marker existed
            self._pass.patches[change_id] = False
            return False
        if self._reach(name, StepKind.VALUE) is None:
            self._record(NewStep(name, 0, StepKind.VALUE, StepStatus.SUCCEEDED, result=True))
        self._pass.patches[change_id] = True
        return True

    def deprecate_patch(self, change_id: str) -> None:
        """Change ``change_id``'s old path is gone: only its new path remains.

        Replaces ``if ctx.patched(id): new() else: old()`` by ``deprecate_patch(id);
        new()`` once no run in flight still takes the old path. A run that
        recorded the marker replays past it; a new run records none, so once
        no run with the marker is left (``runs check-deploy`` tells), the call
        can go too.
        """
        check_name(change_id, "patch id", MAX_PATCH_ID_LENGTH)
        self._spend()
        name = PATCH_PREFIX + change_id
        index = len(self._pass.reached)
        recorded = self._recorded[index] if index < len(self._recorded) else None
        if recorded is not None and _is_marker(recorded, name):
            self._reach(name, StepKind.VALUE)

    # --- task steps ------------------------------------------------------------
    def step(
        self,
        name: str,
        task: Any,
        *args: Any,
        retries: int = 0,
        retry_delay: float | timedelta = 1.0,
        backoff: float = 2.0,
        queue: str | None = None,
        exchange: str | None = None,
        routing_key: str | None = None,
        priority: int | None = None,
        eager: bool = True,
        **kwargs: Any,
    ) -> JSON:
        """Run ``task`` as a step and return its result (recorded after the first run).

        The result is typed Any: Celery's tasks carry no type hints, and a
        result is read back from JSON (a tuple comes back a list).
        ``queue``, ``exchange``, ``routing_key`` and ``priority`` route the
        step's message over the task's own route (as ``apply_async`` does);
        they never reach the task. ``eager=False`` sends the step through the
        broker even where the step before it could run it at once. Raises
        :class:`StepFailedError` once its ``retries + 1`` attempts failed.
        """
        handle = self.step_async(
            name,
            task,
            *args,
            retries=retries,
            retry_delay=retry_delay,
            backoff=backoff,
            queue=queue,
            exchange=exchange,
            routing_key=routing_key,
            priority=priority,
            eager=eager,
            **kwargs,
        )
        return self.gather(handle)[0]

    def step_async(
        self,
        name: str,
        task: Any,
        *args: Any,
        retries: int = 0,
        retry_delay: float | timedelta = 1.0,
        backoff: float = 2.0,
        queue: str | None = None,
        exchange: str | None = None,
        routing_key: str | None = None,
        priority: int | None = None,
        eager: bool = True,
        **kwargs: Any,
    ) -> StepHandle[Any]:
        """Put a step in flight without waiting; join it with :meth:`gather`.

        Takes the routing options of :meth:`step`."""
        return self.task_async(
            name,
            task,
            args,
            kwargs,
            retries=retries,
            retry_delay=retry_delay,
            backoff=backoff,
            queue=queue,
            exchange=exchange,
            routing_key=routing_key,
            priority=priority,
            eager=eager,
        )

    def task_async(
        self,
        name: str,
        task: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        retries: int = 0,
        retry_delay: float | timedelta = 1.0,
        backoff: float = 2.0,
        queue: str | None = None,
        exchange: str | None = None,
        routing_key: str | None = None,
        priority: int | None = None,
        eager: bool = True,
    ) -> StepHandle[Any]:
        """:meth:`step_async` with the task's arguments as a list and a dict,
        so a task's keyword may share a name with a step option."""
        kwargs = kwargs or {}
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"step {name!r}: retries must be an int >= 0, got {retries!r}")
        if backoff < 1:
            raise ValueError(f"step {name!r}: backoff must be >= 1, got {backoff!r}")
        delay = _seconds(retry_delay)
        step = self._reach(name, StepKind.TASK)
        if step is None:
            task_name = self._resolve_task(task)
            depth = self._limits.max_payload_depth
            check_json(list(args), f"step {name!r}", "args", depth)
            check_json(kwargs, f"step {name!r}", "kwargs", depth)
            route = _route_options(name, queue, exchange, routing_key, priority)
            routed = self._task_queue(task_name, route) if route else self._task_queue(task_name)
            self._record(
                NewStep(
                    name,
                    0,
                    StepKind.TASK,
                    StepStatus.SCHEDULED,
                    task_name=task_name,
                    queue=routed,
                    route=route or None,
                    args=list(args),
                    kwargs=dict(kwargs),
                    max_attempts=retries + 1,
                    retry_delay=delay,
                    backoff=float(backoff),
                    eager=bool(eager),
                )
            )
        elif (
            step.status == StepStatus.FAILED
            and step.wake_at is not None
            and step.scheduled_at is None
        ):
            # Waiting for its next attempt: its message carries the countdown
            # (or, beyond the queue's horizon, the sweep sends it when due).
            self._pass.decision.redispatch.append(step.id)
        return StepHandle(name)

    def recorded_names(self) -> list[str]:
        """The names of the steps the run has recorded, in the order recorded.

        A body that advances several branches at once (the durable canvas)
        reaches these first, in this order, then records what became ready."""
        return [s.name for s in self._recorded]

    # --- joining ---------------------------------------------------------------
    @overload
    def gather(
        self, *handles: StepHandle[_T], return_exceptions: Literal[False] = False
    ) -> list[_T]: ...

    @overload
    def gather(
        self, *handles: StepHandle[_T], return_exceptions: bool
    ) -> list[_T | StepFailedError]: ...

    def gather(self, *handles: StepHandle[Any], return_exceptions: bool = False) -> list[Any]:
        """Wait until every handle's step settled; results in order.

        Typed as a list of the handles' common type (a child's output type,
        Any for task steps), with :class:`StepFailedError` in it when
        ``return_exceptions`` may be true.

        The first failure (in order) is raised as :class:`StepFailedError`,
        or returned in its place with ``return_exceptions=True``.
        """
        self._spend()
        steps = [self._current(h.name) for h in handles]
        if any(s is None or not s.settled for s in steps):
            raise Suspend
        results: list[Any] = []
        for s in steps:
            assert s is not None
            if s.status == StepStatus.SUCCEEDED:
                results.append(s.result)
                continue
            err = _step_failed(s)
            if not return_exceptions:
                raise err
            results.append(err)
        return results

    # --- timers -------------------------------------------------------------------
    def sleep(self, name: str, duration: float | timedelta) -> None:
        """A durable timer: the run sleeps in the database, not in a worker."""
        seconds = _seconds(duration)
        self._timer(name, lambda: self._view.now + round(seconds * 1000))

    def sleep_until(self, name: str, when: datetime) -> None:
        """Sleep until ``when`` (an aware datetime) on the store's clock."""
        if when.tzinfo is None:
            raise ValueError(f"sleep_until({name!r}): give an aware datetime (e.g. UTC)")
        self._timer(name, lambda: round(when.timestamp() * 1000))

    def _timer(self, name: str, due: Callable[[], int]) -> None:
        step = self._reach(name, StepKind.SLEEP)
        now = self._view.now
        if step is None:
            wake_at = due()
            if wake_at <= now:
                self._record(NewStep(name, 0, StepKind.SLEEP, StepStatus.SUCCEEDED))
                return
            self._record(NewStep(name, 0, StepKind.SLEEP, StepStatus.SCHEDULED, wake_at=wake_at))
            self._pass.in_flight_wakes.append(wake_at)
            raise Suspend
        if step.settled:
            return
        if step.wake_at is not None and step.wake_at <= now:
            self._resolve(step, ok=True)
            return
        if step.wake_at is not None:
            self._pass.in_flight_wakes.append(step.wake_at)
        raise Suspend

    # --- signals --------------------------------------------------------------------
    def wait_for_signal(self, name: str, timeout: float | timedelta | None = None) -> JSON:
        """Wait for ``send_signal(run_id, name, payload)``; returns the payload.

        Raises :class:`SignalTimeoutError` when ``timeout`` passes first.
        """
        check_name(name, "signal name", MAX_SIGNAL_NAME_LENGTH)
        step_name = f"{SIGNAL_PREFIX}{name}"
        step = self._reach(step_name, StepKind.SIGNAL)
        signals = self._view.signals
        now = self._view.now
        if step is None:
            if name in signals:
                self._record(
                    NewStep(
                        step_name, 0, StepKind.SIGNAL, StepStatus.SUCCEEDED, result=signals[name]
                    )
                )
                return signals[name]
            wake_at = None if timeout is None else now + round(_seconds(timeout) * 1000)
            self._record(
                NewStep(step_name, 0, StepKind.SIGNAL, StepStatus.SCHEDULED, wake_at=wake_at)
            )
            if wake_at is not None:
                self._pass.in_flight_wakes.append(wake_at)
            raise Suspend
        if step.status == StepStatus.SUCCEEDED:
            return step.result
        if step.settled:
            raise SignalTimeoutError(name)
        if name in signals:
            self._resolve(step, ok=True, result=signals[name])
            return signals[name]
        if step.wake_at is not None and step.wake_at <= now:
            self._resolve(step, ok=False, error=_timeout_error(name))
            raise SignalTimeoutError(name)
        if step.wake_at is not None:
            self._pass.in_flight_wakes.append(step.wake_at)
        raise Suspend

    # --- child workflows ----------------------------------------------------------
    @overload
    def child(self, name: str, workflow: Workflow[_In, _Out], input: _In) -> _Out: ...

    @overload
    def child(self, name: str, workflow: Workflow[None, _Out]) -> _Out: ...

    @overload
    def child(self, name: str, workflow: str, input: JSON = None) -> JSON: ...

    def child(self, name: str, workflow: str | Workflow[Any, Any], input: JSON = None) -> JSON:
        """Run a child workflow and return its output; its failure raises
        :class:`StepFailedError` here.

        Given a :class:`Workflow` (not its name), ``input`` is checked against
        its input type and the output typed as its output."""
        return self.gather(self.child_async(name, workflow, input))[0]

    @overload
    def child_async(
        self, name: str, workflow: Workflow[_In, _Out], input: _In
    ) -> StepHandle[_Out]: ...

    @overload
    def child_async(self, name: str, workflow: Workflow[None, _Out]) -> StepHandle[_Out]: ...

    @overload
    def child_async(self, name: str, workflow: str, input: JSON = None) -> StepHandle[Any]: ...

    def child_async(
        self, name: str, workflow: str | Workflow[Any, Any], input: JSON = None
    ) -> StepHandle[Any]:
        """Start a child run without waiting; join it with :meth:`gather`."""
        step = self._reach(name, StepKind.CHILD)
        if step is None:
            limits = self._limits
            if self._view.run.depth >= limits.max_child_depth:
                raise WorkflowLimitError(
                    f"child step {name!r}: run {self.run_id} is already {self._view.run.depth} "
                    f"level(s) deep, the most children may nest (max_child_depth)"
                )
            if self._children >= limits.max_children_per_run:
                raise WorkflowLimitError(
                    f"child step {name!r}: run {self.run_id} already started "
                    f"{self._children} child runs, the most one run may (max_children_per_run)"
                )
            self._children += 1
            wf = self._lookup_workflow(workflow)
            check_json(input, f"child step {name!r}", "input", self._limits.max_payload_depth)
            self._record(
                NewStep(
                    name,
                    0,
                    StepKind.CHILD,
                    StepStatus.RUNNING,
                    child=NewRun(workflow=wf.name, input=input, workflow_version=wf.version),
                )
            )
        return StepHandle(name)

    # --- bookkeeping ----------------------------------------------------------------
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
                    f"step name {name!r} is used twice in run {self.run_id} "
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
                    f"replay of run {self.run_id} reached {kind.value} step {name!r} as step "
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
                f"step {new.name!r} would be step {seq + 1} of run {self.run_id}, above the "
                f"limit of {self._limits.max_steps_per_run} (max_steps_per_run)"
            )
        self._pass.decision.new_steps.append(replace(new, seq=seq))
        if new.status in (StepStatus.SUCCEEDED,):
            # Settled on record: later calls in this pass may read it.
            self._settled_now[new.name] = StepState(
                id=step_id_for(self.run_id, new.name),
                run_id=self.run_id,
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


def _route_options(
    step: str, queue: Any, exchange: Any, routing_key: Any, priority: Any
) -> dict[str, JSON]:
    """``ctx.step``'s routing options, checked: names are names, a priority 0-255."""
    route: dict[str, JSON] = {}
    for key, value in (("queue", queue), ("exchange", exchange), ("routing_key", routing_key)):
        if value is not None:
            route[key] = check_name(value, f"step {step!r}: {key}")
    if priority is not None:
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 255:
            raise ValueError(f"step {step!r}: priority must be an int 0-255, got {priority!r}")
        route["priority"] = priority
    return route


def _is_marker(step: StepState, name: str) -> bool:
    """Whether ``step`` is the recorded marker ``name`` of ``ctx.patched``."""
    return step.kind == StepKind.VALUE and step.name == name


def _step_failed(step: StepState) -> StepFailedError:
    err = step.error or {}
    return StepFailedError(
        step.name,
        str(err.get("type", "Error")),
        str(err.get("message", "")),
        str(err.get("traceback", "")),
    )


def _timeout_error(name: str) -> dict[str, Any]:
    return {
        "type": "SignalTimeoutError",
        "message": f"signal {name!r} did not arrive before its timeout",
        "traceback": "",
    }


def pass_state(ctx: Context) -> tuple[Decision, Sequence[int]]:
    """The decision a finished pass produced, and the wake times it waits on."""
    return ctx._pass.decision, ctx._pass.in_flight_wakes
