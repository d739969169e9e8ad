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
from ..store.model import JSON, AttemptState, RunState, RunStatus, StepState

if TYPE_CHECKING:
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

    def __init__(self, engine: WorkflowEngine, run_id: str) -> None:
        self.engine = engine
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id}>"

    def state(self) -> RunState:
        """The run as stored now; raises :class:`RunNotFoundError` for an unknown id."""
        run = self.engine.store.get_run(self.run_id)
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
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        notices = self.engine.capabilities.settle
        if notices is not None:
            with notices.settled_listener(self.run_id) as wait_settled:
                if wait_settled is not None:
                    return self._wait_notified(wait_settled, deadline, timeout)
        delay = 0.001
        while True:
            run = self.state()
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
        self, wait_settled: Any, deadline: float | None, timeout: float | None
    ) -> Out:
        """Wait on the store's settle notifications, re-reading at least every second."""
        while True:
            run = self.state()
            if run.status.terminal:
                output: Out = _outcome(run)
                return output
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise WorkflowTimeoutError(
                    f"workflow run {self.run_id} still {run.status} after {timeout} s"
                )
            wait_settled(min(1.0, left))

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
        attempts: dict[str, list[AttemptState]] = {}
        for a in store.get_attempts(self.run_id):
            attempts.setdefault(a.step_id, []).append(a)
        return [
            StepHistory(s, sorted(attempts.get(s.id, []), key=lambda a: a.attempt))
            for s in store.get_steps(self.run_id)
        ]


def _outcome(run: RunState) -> JSON:
    if run.status == RunStatus.COMPLETED:
        return run.output
    if run.status == RunStatus.CANCELLED:
        raise WorkflowCancelledError(run.id)
    if run.status == RunStatus.FAILED:
        raise WorkflowFailedError(run.id, run.error)
    raise WorkflowTimeoutError(f"workflow run {run.id} is still {run.status}")
