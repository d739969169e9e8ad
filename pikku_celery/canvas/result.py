"""``DurableResult``: a durable canvas's run as a Celery ``AsyncResult``.

Code written against ``chain(...).apply_async()`` keeps working when the
canvas goes through ``pikku.durable()``: it is an ``AsyncResult`` (so a
``ResultSet`` or ``isinstance`` check takes it) whose id is the id of the
task whose result the canvas returns, while ``get()`` waits on the run (the
store's settle notice, not a result-backend poll), ``state`` maps the run's
status onto Celery's states, and a failure raises the failed task's own
exception, as ``AsyncResult.get()`` does.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from celery import states
from celery.backends.base import DisabledBackend
from celery.exceptions import TimeoutError as CeleryTimeoutError
from celery.result import AsyncResult, GroupResult

from ..errors import RunSettledError, WorkflowTimeoutError
from ..model.values import RunStatus
from .tree import canvas_tree

if TYPE_CHECKING:
    from .handle import CanvasRun

_SLICE = 0.5
"""How often ``get()`` also asks the result backend whether the result's own
task ended (the run itself is waited on without polling)."""

_UNBUILT = object()

_STATES = {
    RunStatus.RUNNING: states.STARTED,
    RunStatus.SUSPENDED: states.STARTED,
    RunStatus.COMPLETED: states.SUCCESS,
    RunStatus.FAILED: states.FAILURE,
    RunStatus.CANCELLED: states.REVOKED,
}


class DurableResult(AsyncResult):  # type: ignore[misc]  # Celery is untyped
    """The ``AsyncResult`` of a :class:`CanvasRun`. Its ``id`` is the task id
    of the node whose result the canvas returns (a chain's last task, a
    chord's body: the caller's id if it chose one, ``freeze()``,
    ``task_id=``), or the run id for a canvas that returns a group's list.
    Its ``parent``, ``children``, ``results`` (a group's) and
    ``as_tuple()`` are the tree Celery would have returned, built from the
    stored plan (:mod:`.tree`): each node an ``AsyncResult`` of its id,
    which the result backend answers once that node settled."""

    def __init__(self, run: CanvasRun, result_id: str | None = None) -> None:
        self._tree: Any = _UNBUILT
        super().__init__(result_id or run.run_id, app=run.engine.app)
        self.run = run

    def tree(self) -> Any:
        """The canvas's result tree as ``apply_async()`` returns it (built once)."""
        if self._tree is _UNBUILT:
            self._tree = canvas_tree(self.app, self.run.state().input, self.run.run_id)
        return self._tree

    @property
    def parent(self) -> Any:
        """The result before this one, as Celery links them (a chain's previous
        task, a chord's header), or None."""
        tree = self.tree()
        return None if tree is None else tree.parent

    @parent.setter
    def parent(self, _: Any) -> None:
        """The tree is the stored plan's (``AsyncResult.__init__`` sets None)."""

    @property
    def results(self) -> list[Any]:
        """A group's members' results, as ``GroupResult.results``."""
        tree = self.tree()
        if not isinstance(tree, GroupResult):
            raise AttributeError("results: this canvas returns one task's result, not a group's")
        return list(tree.results)

    @property
    def children(self) -> Any:
        """A group's members' results; a task's, as ``AsyncResult.children``."""
        tree = self.tree()
        if isinstance(tree, GroupResult):
            return list(tree.results)
        return super().children

    def as_tuple(self) -> Any:
        """Celery's tuple form of the tree (``ResultBase.as_tuple``)."""
        parent = self.parent
        own = (self.id, parent.as_tuple() if parent is not None else None)
        tree = self.tree()
        if isinstance(tree, GroupResult):
            return own, [r.as_tuple() for r in tree.results]
        return own, None

    def __repr__(self) -> str:
        return f"<DurableResult: {self.id} (run {self.run.run_id})>"

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        no_ack: bool = True,
        follow_parents: bool = True,
        callback: Any = None,
        on_message: Any = None,
        on_interval: Any = None,
        disable_sync_subtasks: bool = True,
        **_: Any,
    ) -> Any:
        """What ``AsyncResult.get()`` returns for the same canvas; Celery's
        ``TimeoutError`` after ``timeout`` seconds; the task's own exception
        on failure (returned instead when ``propagate`` is False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                value = self.run.wait(_SLICE if left is None else min(_SLICE, left))
            except WorkflowTimeoutError as late:
                # The result's own task may have ended while the run waits on
                # its errbacks or links: AsyncResult.get() returns then.
                meta = self._settled_meta()
                if meta is not None:
                    value = meta["result"]
                    if meta["status"] != states.SUCCESS:
                        if propagate:
                            raise value from None
                        return value
                    break
                if left is not None and left <= _SLICE:
                    raise CeleryTimeoutError("The operation timed out.") from late
                continue
            except Exception as failed:
                if propagate:
                    raise
                return failed
            break
        if callback is not None:
            callback(self.id, value)
        return value

    def _settled_meta(self) -> dict[str, Any] | None:
        """The result backend's record of this result's task, once it settled
        for good (never for a result that is the run itself)."""
        if self.id == self.run.run_id or isinstance(self.backend, DisabledBackend):
            return None
        meta: dict[str, Any] = self.backend.get_task_meta(self.id)
        return meta if meta.get("status") in states.READY_STATES else None

    wait = get

    @property
    def state(self) -> str:
        """Celery's state name for the run: ``STARTED`` until it settles, then
        ``SUCCESS``, ``FAILURE`` or ``REVOKED`` (cancelled)."""
        return str(_STATES[self.run.status()])

    status = state

    def ready(self) -> bool:
        """Whether the run settled (completed, failed or cancelled)."""
        return self.run.status().terminal

    def successful(self) -> bool:
        """Whether the run completed."""
        return self.run.status() is RunStatus.COMPLETED

    def failed(self) -> bool:
        """Whether the run failed or was cancelled."""
        return self.run.status() in (RunStatus.FAILED, RunStatus.CANCELLED)

    @property
    def result(self) -> Any:
        """The value once completed, the exception once failed, else None."""
        if not self.run.status().terminal:
            return None
        return self.get(propagate=False)

    info = result

    def revoke(self, *_: Any, **__: Any) -> None:
        """Cancel the run (its steps in flight finish, nothing new starts)."""
        with contextlib.suppress(RunSettledError):
            self.run.cancel()
