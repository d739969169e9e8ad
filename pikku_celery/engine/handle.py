"""``RunHandle``: what ``start`` returns, to watch, wait on or cancel a run."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from ..errors import (
    RunNotFoundError,
    WorkflowCancelledError,
    WorkflowDeadlineError,
    WorkflowFailedError,
    WorkflowTimeoutError,
)
from ..model.values import JSON, AttemptState, ErrorInfo, RunState, RunStatus, StepState
from ..store.events import RunEvent
from .deadline import DEADLINE_ERROR
from .events import run_events, wait_for_event
from .outage import ride_out

if TYPE_CHECKING:
    from ..ports.store import SettleWatch, WorkflowStore
    from .core import WorkflowEngine

# The run's output type (the workflow's ``Out``); a bare ``RunHandle``, as
# ``engine.handle(run_id)`` returns, is ``RunHandle[Any]``.
Out = TypeVar("Out", covariant=True, default=Any)


@dataclass(frozen=True)
class StepHistory:
    """A step with every attempt it took, oldest first."""

    step: StepState
    attempts: list[AttemptState]


def read_history(
    store: WorkflowStore, run_id: str, after: int | None = None, limit: int | None = None
) -> list[StepHistory]:
    """The run's steps with their attempts: all of them, or the page of at
    most ``limit`` with ``seq`` above ``after`` (the attempts of that page
    only). Raises ``ValueError`` for a negative ``after`` or a ``limit``
    below 1."""
    if after is not None and after < 0:
        raise ValueError(f"after must be a step's seq (0 or more), not {after}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be 1 or more, not {limit}")
    if after is None and limit is None:
        steps, attempts = store.get_steps(run_id), store.get_attempts(run_id)
    else:
        low = -1 if after is None else after
        if limit is None:
            steps = [s for s in store.get_steps(run_id) if s.seq > low]
        else:
            steps = store.get_steps_page(run_id, after, limit)
        attempts = [] if not steps else store.get_attempts_page(run_id, after, steps[-1].seq)
    return with_attempts(steps, attempts)


def with_attempts(
    steps: Sequence[StepState], attempts: Iterable[AttemptState]
) -> list[StepHistory]:
    """Each of ``steps`` with its own of ``attempts``, by attempt number."""
    by_step: dict[str, list[AttemptState]] = {}
    for a in attempts:
        by_step.setdefault(a.step_id, []).append(a)
    return [StepHistory(s, sorted(by_step.get(s.id, []), key=lambda a: a.attempt)) for s in steps]


class RunHandle(Generic[Out]):
    """A started run, by id: its state, its steps, and waiting for its outcome.

    ``Workflow[In, Out].start`` returns a ``RunHandle[Out]``: ``wait`` and
    ``result`` are typed as the workflow function's return type. (The output
    is read back from JSON, so that holds for JSON-shaped types.)
    """

    def __init__(
        self, engine: WorkflowEngine, run_id: str, started_at: float | None = None
    ) -> None:
        self.engine = engine
        self.run_id = run_id
        # time.monotonic() before this process created the run (start()): a
        # settle listener that has listened since then heard of its end.
        self._started_at = started_at

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id}>"

    def state(self) -> RunState:
        """The run as stored now; raises :class:`RunNotFoundError` for an unknown id,
        :class:`StoreUnavailableError` once a store outage outlasts the
        engine's ``outage_timeout``."""
        return self._read(None)

    def _read(self, deadline: float | None) -> RunState:
        """The run, riding out an outage until ``deadline`` (None: for the
        engine's ``outage_timeout``)."""
        within = None if deadline is None else deadline - time.monotonic()
        store = self.engine.store
        run = ride_out(
            self.engine, lambda: store.get_run(self.run_id), f"reading run {self.run_id}", within
        )
        if run is None:
            raise RunNotFoundError(f"no workflow run {self.run_id!r}")
        return run

    def status(self) -> RunStatus:
        """The run's current status (a fresh read of the store)."""
        return self.state().status

    def wait(self, timeout: float | None = None, *, follow: bool = True) -> Out:
        """The run's output once it completes; with ``follow``, the output of
        the last run of its ``continue_as_new`` chain (as Temporal's result
        follows runs), ``timeout`` covering the whole chain.

        Raises :class:`WorkflowFailedError` / :class:`WorkflowCancelledError`
        when it ends otherwise, :class:`WorkflowTimeoutError` after
        ``timeout`` seconds. On PostgreSQL it wakes on the store's NOTIFY
        when the run settles; elsewhere it polls from 1 ms, backing off to
        50 ms. Either way a short run is not slowed by the wait itself.

        A store outage (a database restart) is waited out within ``timeout``;
        one that lasts until the timeout raises :class:`StoreUnavailableError`.
        Without a timeout, an outage longer than the engine's
        ``outage_timeout`` raises it.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        handle: RunHandle[Out] = self
        while True:
            output = handle._wait_one(deadline, timeout)
            # A run that continued completed with None: only then is a link read.
            successor = None if output is not None or not follow else handle._successor(deadline)
            if successor is None:
                return output
            handle = successor

    def _wait_one(self, deadline: float | None, timeout: float | None) -> Out:
        """This run's own output once it completes (:meth:`wait`)."""
        notices = self.engine.capabilities.settle
        if notices is not None:
            with notices.settled_listener(self.run_id) as watch:
                if watch is not None:
                    return self._wait_notified(watch, deadline, timeout)
        delay = 0.001
        while True:
            run = self._read(deadline)
            if run.status.terminal:
                output: Out = _outcome(run)
                return output
            if deadline is not None and time.monotonic() >= deadline:
                raise WorkflowTimeoutError(
                    f"workflow run {self.run_id} still {run.status} after {timeout} s"
                )
            pause = delay if deadline is None else min(delay, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(delay * 1.5, 0.05)

    def _wait_notified(
        self, watch: SettleWatch, deadline: float | None, timeout: float | None
    ) -> Out:
        """Wait on the store's settle notices, re-reading at least every second.

        A run this process started while the listener listened needs no
        read before its notice, and none after one that carried its outcome.
        """
        started = self._started_at
        unread = started is not None and watch.heard_since(started)
        while True:
            settled = watch.settled()
            if settled is not None:
                told: Out = _ended(self.run_id, settled.status, settled.output, settled.error)
                return told
            if not unread:
                run = self._read(deadline)
                if run.status.terminal:
                    output: Out = _outcome(run)
                    return output
            unread = False
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                status = self._read(time.monotonic()).status
                raise WorkflowTimeoutError(
                    f"workflow run {self.run_id} still {status} after {timeout} s"
                )
            watch.wait(min(1.0, left))

    def result(self, *, follow: bool = True) -> Out:
        """The output of a settled run (raises like :meth:`wait` otherwise);
        with ``follow``, of the last run of its ``continue_as_new`` chain."""
        run = self.state()
        while follow and run.continued_as is not None:
            run = RunHandle(self.engine, run.continued_as).state()
        output: Out = _outcome(run)
        return output

    def successor(self) -> RunHandle[Out] | None:
        """The run this one continued as (``ctx.continue_as_new``), or None."""
        return self._successor(None)

    def _successor(self, deadline: float | None) -> RunHandle[Out] | None:
        found = self._read(deadline).continued_as
        return None if found is None else RunHandle(self.engine, found)

    def predecessor(self) -> RunHandle[Out] | None:
        """The run that continued as this one, or None."""
        found = self.state().continued_from
        return None if found is None else RunHandle(self.engine, found)

    def latest(self) -> RunHandle[Out]:
        """The newest run of this run's ``continue_as_new`` chain (this one
        if it has not continued)."""
        handle: RunHandle[Out] = self
        while (successor := handle.successor()) is not None:
            handle = successor
        return handle

    def cancel(self) -> RunState:
        """Ask the run (and its children) to end as cancelled; a settled run refuses."""
        return self.engine.cancel(self.run_id)

    def signal(self, name: str, payload: JSON = None) -> RunState:
        """Send the run signal ``name``; the same as ``Pikku.send_signal`` for this run."""
        return self.engine.send_signal(self.run_id, name, payload)

    def steps(self, after: int | None = None, limit: int | None = None) -> list[StepHistory]:
        """The steps with their attempt history, in the order recorded: every
        one by default, or a page: at most ``limit`` of those whose ``seq`` is
        above ``after`` (pass the last step's ``seq`` of a page to read the
        next), so a long history is read in bounded pieces."""
        what = f"reading the steps of run {self.run_id}"
        return ride_out(
            self.engine, lambda: read_history(self.engine.store, self.run_id, after, limit), what
        )

    def events(self) -> list[RunEvent]:
        """Every progress event the run has set (``ctx.set_event``), in order."""
        return run_events(self.engine, self.run_id)

    def get_event(self, key: str, timeout: float | None = None) -> JSON:
        """The latest value the run set for event ``key``.

        Waits up to ``timeout`` seconds (None: as long as the run lives) for
        the first one; raises :class:`EventTimeoutError` when the timeout
        passes first, :class:`EventNotSetError` when the run ended without
        setting it (both are :class:`EventNotSetError`).
        """
        return wait_for_event(self.engine, self.run_id, key, timeout).value


def _outcome(run: RunState) -> JSON:
    return _ended(run.id, run.status, run.output, run.error)


def _ended(run_id: str, status: RunStatus, output: JSON, error: ErrorInfo | None) -> JSON:
    if status == RunStatus.COMPLETED:
        return output
    if status == RunStatus.CANCELLED:
        raise WorkflowCancelledError(run_id)
    if status == RunStatus.FAILED:
        if error is not None and error.get("type") == DEADLINE_ERROR:
            raise WorkflowDeadlineError(run_id, error)
        raise WorkflowFailedError(run_id, error)
    raise WorkflowTimeoutError(f"workflow run {run_id} is still {status}")
