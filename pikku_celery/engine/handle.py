"""``RunHandle``: what ``start`` returns, to watch, wait on or cancel a run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic

from typing_extensions import TypeVar

from ..errors import (
    RunNotFoundError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowTimeoutError,
)
from ..store.model import JSON, AttemptState, ErrorInfo, RunState, RunStatus, StepState
from .outage import ride_out

if TYPE_CHECKING:
    from ..store.base import SettleWatch
    from .core import WorkflowEngine

# The run's output type (the workflow's ``Out``); a bare ``RunHandle``, as
# ``engine.handle(run_id)`` returns, is ``RunHandle[Any]``.
Out = TypeVar("Out", covariant=True, default=Any)


@dataclass(frozen=True)
class StepHistory:
    """A step with every attempt it took, oldest first."""

    step: StepState
    attempts: list[AttemptState]


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

    def wait(self, timeout: float | None = None) -> Out:
        """The run's output once it completes.

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

    def result(self) -> Out:
        """The output of a settled run (raises like :meth:`wait` otherwise)."""
        output: Out = _outcome(self.state())
        return output

    def cancel(self) -> RunState:
        """Ask the run (and its children) to end as cancelled; a settled run refuses."""
        return self.engine.cancel(self.run_id)

    def signal(self, name: str, payload: JSON = None) -> RunState:
        """Send the run signal ``name``; the same as ``Pikku.send_signal`` for this run."""
        return self.engine.send_signal(self.run_id, name, payload)

    def steps(self) -> list[StepHistory]:
        """Every step with its attempt history, in the order recorded."""
        store = self.engine.store
        what = f"reading the steps of run {self.run_id}"
        attempts: dict[str, list[AttemptState]] = {}
        for a in ride_out(self.engine, lambda: store.get_attempts(self.run_id), what):
            attempts.setdefault(a.step_id, []).append(a)
        return [
            StepHistory(s, sorted(attempts.get(s.id, []), key=lambda a: a.attempt))
            for s in ride_out(self.engine, lambda: store.get_steps(self.run_id), what)
        ]


def _outcome(run: RunState) -> JSON:
    return _ended(run.id, run.status, run.output, run.error)


def _ended(run_id: str, status: RunStatus, output: JSON, error: ErrorInfo | None) -> JSON:
    if status == RunStatus.COMPLETED:
        return output
    if status == RunStatus.CANCELLED:
        raise WorkflowCancelledError(run_id)
    if status == RunStatus.FAILED:
        raise WorkflowFailedError(run_id, error)
    raise WorkflowTimeoutError(f"workflow run {run_id} is still {status}")
