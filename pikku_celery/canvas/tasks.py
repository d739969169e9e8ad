"""What ``Pikku`` registers for durable canvas: the ``pikku.canvas`` workflow,
the task that calls a new-style errback and the one that marks never-run
nodes' results failed."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import states
from celery.app.task import Context as Request
from celery.backends.base import DisabledBackend

from .backend import ResultBackendWriter
from .interpret import run_canvas
from .names import ERRBACK_TASK, FAIL_UNRUN_TASK, WORKFLOW
from .rebuild import rebuild_exception
from .replace import install_replace

if TYPE_CHECKING:
    from ..celery.integration import Pikku

log = logging.getLogger(__name__)


def install(pikku: Pikku) -> None:
    """Register the canvas workflow and the errback task on ``pikku``'s app."""
    install_replace()
    pikku.observers.add(ResultBackendWriter(pikku.app))
    canvas = pikku.workflow(run_canvas, name=WORKFLOW)
    canvas.by_name_refusal = (
        "its input names the tasks to run, so it is started by pikku.durable(canvas), "
        "which checks the canvas"
    )
    app = pikku.app

    def call_errback(errback: dict[str, Any], failed: dict[str, Any]) -> None:
        """Call ``errback(request, exc, traceback)`` as Celery's worker does; its
        own error is logged, as Celery logs it."""
        request = Request(
            id=failed["id"], task=failed["task"], args=failed["args"], kwargs=failed["kwargs"]
        )
        error = failed["error"]
        exc = rebuild_exception(app, failed["task"], error)
        signature = app.signature(
            errback["task"],
            args=errback["args"],
            kwargs=errback["kwargs"],
            immutable=errback["immutable"],
        )
        try:
            signature(request, exc, error.get("traceback") or None)
        except Exception:
            log.exception("Errback %r raised an exception", errback["task"])

    app.task(name=ERRBACK_TASK, shared=False, serializer="json")(call_errback)

    def fail_unrun(ids: list[str], error: dict[str, Any]) -> None:
        """Mark each id failed with ``error`` in the result backend, as
        Celery marks a chord's body (and the chain after it) whose header
        failed: what waits on those results ends."""
        if isinstance(app.backend, DisabledBackend):
            return
        exc = rebuild_exception(app, None, error)
        for task_id in ids:
            app.backend.store_result(task_id, exc, states.FAILURE, traceback=None)

    app.task(name=FAIL_UNRUN_TASK, shared=False, serializer="json")(fail_unrun)
