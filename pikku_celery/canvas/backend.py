"""Each settled canvas node written to Celery's result backend under its id.

Code that keeps a task id for later (a frozen signature's, ``task_id=``)
looks it up with ``AsyncResult(id)``: once a node settles for good, its
result (or its task's exception) is stored in the app's result backend under
the node's id, as the worker would have stored it. Written after the
outcome is recorded, so the backend never shows an outcome the store
refused; an app without a result backend, or a task with ``ignore_result``,
gets nothing written (as Celery writes nothing for it).
"""

from __future__ import annotations

from celery import Celery, states
from celery.backends.base import DisabledBackend

from ..engine.observe import EngineObserver
from ..engine.replacement import replacement
from ..engine.task_id import TASK_ID
from ..model.values import StepOutcome, StepState
from .added import additions
from .node_rules import is_node_step
from .rebuild import rebuild_exception
from .wire import decoded


class ResultBackendWriter(EngineObserver):
    """Stores a canvas node's final outcome in ``app.backend`` under its task id."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        task_id = (step.route or {}).get(TASK_ID)
        if not isinstance(task_id, str) or not is_node_step(step.name):
            return
        final = outcome.ok or outcome.retry_delay is None or step.attempt >= step.max_attempts
        backend = self.app.backend
        if not final or isinstance(backend, DisabledBackend):
            return
        task = self.app.tasks.get(step.task_name or "")
        if task is not None and task.ignore_result:
            return  # Celery stores nothing for it either
        if outcome.ok:
            if replacement(outcome.result) is not None:
                return  # its replacement's last node writes this id
            value, _ = additions(outcome.result)
            backend.store_result(task_id, decoded(value), states.SUCCESS)
            return
        error = dict(outcome.error or {})
        exc = rebuild_exception(self.app, step.task_name, error)
        backend.store_result(task_id, exc, states.FAILURE, traceback=error.get("traceback"))
