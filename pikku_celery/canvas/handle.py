"""``CanvasRun``: a durable canvas's handle, answering as ``AsyncResult.get()`` does."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..engine.handle import RunHandle
from ..engine.outage import ride_out
from ..errors import WorkflowFailedError
from ..store.model import step_id_for
from .tasks import rebuild_exception

if TYPE_CHECKING:
    from ..celery.integration import Pikku

_NODE_FAILED = re.compile(
    r"step '(?P<step>[^']+)' failed: (?P<type>[^:\s]+): (?P<message>.*)", re.S
)


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

    def wait(self, timeout: float | None = None) -> Any:
        try:
            return super().wait(timeout)
        except WorkflowFailedError as failed:
            raise self.task_error(failed) from failed

    def result(self) -> Any:
        try:
            return super().result()
        except WorkflowFailedError as failed:
            raise self.task_error(failed) from failed

    def task_error(self, failed: WorkflowFailedError) -> BaseException:
        """The exception Celery would raise for this failure (the run's own
        error when it is not a task's: a limit, a corrupt plan)."""
        error = failed.error
        found = _NODE_FAILED.fullmatch(str(error.get("message", "")))
        if error.get("type") != "StepFailedError" or found is None:
            return failed
        step_id = step_id_for(self.run_id, found["step"])
        step = ride_out(
            self.engine, lambda: self.engine.store.get_step(step_id), f"reading step {step_id}"
        )
        task_name = step.task_name if step is not None else None
        error = {"type": found["type"], "message": found["message"]}
        return rebuild_exception(self.engine.app, task_name, error)
