"""What ``Pikku`` registers for durable canvas: the ``pikku.canvas`` workflow
and the task that calls a new-style errback."""

from __future__ import annotations

import ast
import builtins
import contextlib
import logging
import sys
from typing import TYPE_CHECKING, Any

import celery.exceptions
from celery import Celery
from celery.app.task import Context as Request

from .interpret import run_canvas
from .names import ERRBACK_TASK, WORKFLOW

if TYPE_CHECKING:
    from ..celery.integration import Pikku

log = logging.getLogger(__name__)


def install(pikku: Pikku) -> None:
    """Register the canvas workflow and the errback task on ``pikku``'s app."""
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


def rebuild_exception(app: Celery, task_name: str | None, error: dict[str, Any]) -> BaseException:
    """The failed task's exception, made again from its recorded type and
    message, as Celery's result backend rebuilds it: the class is looked up
    among the builtins, Celery's exceptions and the task's own module (never
    imported for this); a type not found comes back as an ``Exception`` of
    that name."""
    name = str(error.get("type", "Exception"))
    message = str(error.get("message", ""))
    if name == "KeyError" and message[:1] in ("'", '"'):
        # str(KeyError(key)) is the key's repr: the key is what it was made with.
        with contextlib.suppress(ValueError, SyntaxError):
            message = str(ast.literal_eval(message))
    places: list[Any] = [builtins, celery.exceptions]
    task = app.tasks.get(task_name or "")
    module = sys.modules.get(getattr(getattr(task, "run", None), "__module__", "") or "")
    if module is not None:
        places.append(module)
    for place in places:
        cls = getattr(place, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                rebuilt: BaseException = cls(message)
            except Exception:
                break
            return rebuilt
    unknown: type[Exception] = type(name, (Exception,), {"__module__": "pikku_celery.canvas"})
    return unknown(message)
