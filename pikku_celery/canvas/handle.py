"""``CanvasRun``: a durable canvas's handle, answering as ``AsyncResult.get()`` does."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..engine.handle import RunHandle
from ..engine.outage import ride_out
from ..errors import WorkflowFailedError
from ..model.values import StepState, step_id_for
from ..ports.store import WorkflowStore
from .plan import result_node
from .rebuild import rebuild_exception
from .result import DurableResult
from .slices import SUFFIX as SLICE_SUFFIX
from .wire import decoded

if TYPE_CHECKING:
    from ..celery.integration import Pikku

_NODE_FAILED = re.compile(
    r"step '(?P<step>[^']+)' failed: (?P<type>[^:\s]+): (?P<message>.*)", re.S
)


def _node_step(store: WorkflowStore, run_id: str, name: str) -> StepState | None:
    """The step of the node at path ``name``: in the run, or in one of its
    slices' child runs (a large group's members run there)."""
    step = store.get_step(step_id_for(run_id, name), run_id=run_id)
    if step is not None:
        return step
    for part in store.get_steps(run_id):
        if SLICE_SUFFIX in part.name and part.child_run_id is not None:
            step = _node_step(store, part.child_run_id, name)
            if step is not None:
                return step
    return None


class CanvasRun(RunHandle[Any]):
    """A run of a durable canvas: ``wait()`` returns what Celery's
    ``AsyncResult.get()`` returns for the same canvas (a chain's last
    result, a group's list, a chord's body result) and raises the failed
    task's own exception (rebuilt from its type and message, the
    :class:`WorkflowFailedError` as its ``__cause__``). ``status()``,
    ``steps()``, ``cancel()`` are a workflow run's; each step's name is its
    node's path in the canvas (``canvas.1.h0``: the first header member of
    the chord that is the chain's second step)."""

    engine: Pikku

    def async_result(self) -> DurableResult:
        """This run as a Celery ``AsyncResult`` (``get``, ``state``,
        ``ready``, ...): see :class:`DurableResult` for its ``id``."""
        plan = self.state().input
        root = plan.get("root") if isinstance(plan, dict) else None
        found = result_node(root) if isinstance(root, dict) else None
        if found is None:
            return DurableResult(self)
        node, path = found
        chosen = node.get("id")
        if not isinstance(chosen, str):
            chosen = step_id_for(self.run_id, path)  # the node's task id
        return DurableResult(self, chosen)

    def wait(self, timeout: float | None = None, *, follow: bool = True) -> Any:
        try:
            return decoded(super().wait(timeout, follow=follow))
        except WorkflowFailedError as failed:
            raise self.task_error(failed) from failed

    def result(self, *, follow: bool = True) -> Any:
        try:
            return decoded(super().result(follow=follow))
        except WorkflowFailedError as failed:
            raise self.task_error(failed) from failed

    def task_error(self, failed: WorkflowFailedError) -> BaseException:
        """The exception Celery would raise for this failure (the run's own
        error when it is not a task's: a limit, a corrupt plan)."""
        error = failed.error
        found = _NODE_FAILED.fullmatch(str(error.get("message", "")))
        if error.get("type") != "StepFailedError" or found is None:
            return failed
        step = ride_out(
            self.engine,
            lambda: _node_step(self.engine.store, self.run_id, found["step"]),
            f"reading step {found['step']} of run {self.run_id}",
        )
        task_name = step.task_name if step is not None else None
        error = {"type": found["type"], "message": found["message"]}
        recorded = step.error if step is not None else None
        if recorded and recorded.get("type") == found["type"] and "args" in recorded:
            error["args"] = recorded["args"]  # rebuilt with all its arguments
        return rebuild_exception(self.engine.app, task_name, error)
