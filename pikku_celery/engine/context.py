"""``Context``: what a workflow body calls during one replay pass.

The body is re-run from the top on every pass. Each call either returns what
is recorded, records something new for the store to apply, or suspends the
pass (a :class:`Suspend` that user code cannot swallow with ``except
Exception``) because the run has to wait. How a call reaches and records its
step (order, unique names, the pass's budget) is :mod:`.pass_record`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn, overload

from typing_extensions import TypeVar

from ..errors import SignalTimeoutError, StepFailedError, WorkflowLimitError
from ..model.values import (
    JSON,
    NewRun,
    NewStep,
    RunView,
    StepKind,
    StepState,
    StepStatus,
    step_id_for,
)
from ..names import (
    MAX_EVENT_KEY_LENGTH,
    MAX_PATCH_ID_LENGTH,
    MAX_SIGNAL_NAME_LENGTH,
    PATCH_PREFIX,
    SIGNAL_PREFIX,
    check_name,
)
from ..payload import check_json
from ..store.events import event_step_name
from .continuing import continuation
from .parking import awaits_retry as _awaits_retry
from .parking import waits as _waits
from .pass_record import PassRecord, StepHandle, Suspend, pass_state
from .replacement import SUFFIX as REPLACED_SUFFIX
from .replacement import replacement, unwrapped
from .step_options import route_options as _route_options
from .step_options import seconds as _seconds
from .step_options import timeout_ms as _timeout_ms
from .task_id import DELAYED, EXTRAS, TASK_ID, TIME_LIMITS

if TYPE_CHECKING:
    from .limits import Limits
    from .workflow import Workflow

__all__ = ["Context", "StepHandle", "Suspend", "pass_state"]

_T = TypeVar("_T")
_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Context(PassRecord):
    """The workflow body's handle on its run."""

    def __init__(
        self,
        view: RunView,
        resolve_task: Callable[[Any], str],
        task_queue: Callable[..., str | None],
        lookup_workflow: Callable[[str | Workflow[Any, Any]], Workflow[Any, Any]],
        limits: Limits | None = None,
    ) -> None:
        super().__init__(view, resolve_task, task_queue, lookup_workflow, limits)
        # Kept for a parked body (engine/parking.py, engine/resume.py):
        self._park: Callable[[], None] | None = None  # set while a resume.Body holds it
        self._open = {s.seq for s in self._recorded if not s.settled}  # what may still change
        self._retrying = {  # task steps waiting for their next attempt's message
            s.seq for s in self._recorded if s.kind == StepKind.TASK and _awaits_retry(s)
        }
        self._changed: set[str] = set()  # steps rebase() found new or changed
        self._again = False  # a waiting call made again after its body was resumed
        self._pending: set[str] = set()  # the unsettled handles of the gather it waits in

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

    # --- progress events ---------------------------------------------------------
    def set_event(self, key: str, value: JSON) -> None:
        """Publish ``value`` as the run's latest event ``key``, for
        ``RunHandle.get_event``/``events`` and the run page.

        Recorded like a step (the value step ``event:<key>#<n>``), in the same
        write as the pass's next step, so a reader sees it once that pass
        commits. A replay reaches the recorded event and records nothing: the
        value first recorded stands, and no event is ever set twice.
        """
        check_name(key, "event key", MAX_EVENT_KEY_LENGTH)
        events = self._pass.events
        number = events.get(key, 0)
        events[key] = number + 1
        name = event_step_name(key, number)
        if self._reach(name, StepKind.VALUE) is None:
            check_json(value, f"event {key!r}", "value", self._limits.max_payload_depth)
            self._record(NewStep(name, 0, StepKind.VALUE, StepStatus.SUCCEEDED, result=value))

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
        timeout: float | timedelta | None = None,
        **kwargs: Any,
    ) -> JSON:
        """Run ``task`` as a step and return its result (recorded after the first run).

        The result is typed Any: Celery's tasks carry no type hints, and a
        result is read back from JSON (a tuple comes back a list).
        ``queue``, ``exchange``, ``routing_key`` and ``priority`` route the
        step's message over the task's own route (as ``apply_async`` does);
        they never reach the task. ``eager=False`` sends the step through the
        broker even where the step before it could run it at once.
        ``timeout`` bounds each attempt: past it the body is interrupted
        (:class:`~pikku_celery.errors.StepTimeLimitExceeded` raised in it),
        the attempt fails with :class:`~pikku_celery.errors.WorkflowStepTimeoutError`
        and retries while it has attempts left; a body that does not stop
        loses its lease, so the step is taken over. Raises
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
            timeout=timeout,
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
        timeout: float | timedelta | None = None,
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
            timeout=timeout,
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
        task_id: str | None = None,
        timeout: float | timedelta | None = None,
        time_limits: tuple[float | None, float | None] = (None, None),
        delayed: bool = False,
        extras: Mapping[str, JSON] | None = None,
    ) -> StepHandle[Any]:
        """:meth:`step_async` with the task's arguments as a list and a dict,
        so a task's keyword may share a name with a step option. ``task_id``
        is the id the task sees as ``self.request.id`` in every attempt (a
        canvas node's result id); by default each attempt has its own.
        ``time_limits`` (hard, soft; seconds) travel on the step's message,
        as ``apply_async(time_limit=, soft_time_limit=)`` sends them, so such
        a step is never run eagerly. ``delayed``: it is recorded when a
        delay before it ended, so its request's ``eta`` is its creation."""
        kwargs = kwargs or {}
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"step {name!r}: retries must be an int >= 0, got {retries!r}")
        if backoff < 1:
            raise ValueError(f"step {name!r}: backoff must be >= 1, got {backoff!r}")
        delay = _seconds(retry_delay)
        timeout_ms = None if timeout is None else _timeout_ms(name, timeout)
        step = self._reach(name, StepKind.TASK)
        if step is None:
            task_name = self._resolve_task(task)
            depth = self._limits.max_payload_depth
            check_json(list(args), f"step {name!r}", "args", depth)
            check_json(kwargs, f"step {name!r}", "kwargs", depth)
            route = _route_options(name, queue, exchange, routing_key, priority)
            routed = self._task_queue(task_name, route) if route else self._task_queue(task_name)
            if task_id is not None:
                route[TASK_ID] = check_name(task_id, f"step {name!r}: task_id")
            if delayed:
                route[DELAYED] = True
            if extras:
                route[EXTRAS] = dict(extras)
            for key, limit in zip(TIME_LIMITS, time_limits, strict=True):
                if limit is not None:
                    route[key] = float(limit)
                    eager = False  # Celery enforces it per message
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
                    timeout_ms=timeout_ms,
                )
            )
        elif _awaits_retry(step):
            # Waiting for its next attempt: its message carries the countdown
            # (or, beyond the queue's horizon, the sweep sends it when due).
            self._pass.decision.redispatch.append(step.id)
        return StepHandle(name)

    def recorded_names(self) -> list[str]:
        """The names of the steps the run has recorded, in the order recorded.

        A body that advances several branches at once (the durable canvas)
        reaches these first, in this order, then records what became ready."""
        self._park = None  # the answer grows with the view: such a body is only replayed
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

    @_waits
    def gather(self, *handles: StepHandle[Any], return_exceptions: bool = False) -> list[Any]:
        """Wait until every handle's step settled; results in order.

        Typed as a list of the handles' common type (a child's output type,
        Any for task steps), with :class:`StepFailedError` in it when
        ``return_exceptions`` may be true.

        The first failure (in order) is raised as :class:`StepFailedError`,
        or returned in its place with ``return_exceptions=True``.
        """
        self._spend()
        if self._unsettled(handles):
            raise Suspend
        steps = self._replaced([self._current(h.name) for h in handles])
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

    def _unsettled(self, handles: Sequence[StepHandle[Any]]) -> bool:
        """Whether a handle's step is unsettled; made again after a resume, it
        looks only at the steps that changed, so a wide gather costs a pass
        what changed, not its width."""
        pending = self._pending
        if self._again:
            for name in pending & self._changed:
                step = self._current(name)
                if step is not None and step.settled:
                    pending.discard(name)
        else:
            pending.clear()
            for h in handles:
                step = self._current(h.name)
                if step is None or not step.settled:
                    pending.add(h.name)
        return bool(pending)

    def _replaced(self, steps: list[StepState | None]) -> list[StepState | None]:
        """Each step whose task replaced itself (``self.replace``) as its
        replacement's outcome: the child run is started (in handle order,
        so replay reaches it in the same place) and joined; see
        :mod:`.replacement`."""
        out: list[StepState | None] = []
        waiting = False
        for s in steps:
            found = None
            if s is not None and s.status == StepStatus.SUCCEEDED:
                found = replacement(s.result)
            if s is None or found is None:
                out.append(s)
                continue
            name = s.name + REPLACED_SUFFIX
            if name not in self._pass.reached:
                self.child_async(name, found[0], found[1])
            child = self._current(name)
            if child is None or not child.settled:
                waiting = True
                out.append(s)
            elif child.status == StepStatus.SUCCEEDED:
                out.append(replace(s, result=child.result))
            else:
                kind, message, trace = unwrapped(child.error or {})
                error = {"type": kind, "message": message, "traceback": trace}
                out.append(replace(s, status=StepStatus.FAILED, error=error))
        if waiting:
            raise Suspend
        return out

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

    @_waits
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
    @_waits
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

    def continue_as_new(
        self, input: JSON = None, *, workflow: str | Workflow[Any, Any] | None = None
    ) -> NoReturn:
        """End this run (completed, output None) and start a new run of its
        workflow (or ``workflow``) on ``input`` in the same write, with an
        empty history: how an endless run stays bounded (:mod:`.continuing`)."""
        self._spend()
        wf = self._lookup_workflow(self._view.run.workflow if workflow is None else workflow)
        limits = self._limits
        raise continuation(self._view.run, wf, input, limits.max_payload_depth)


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
