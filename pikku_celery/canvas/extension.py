"""Durable canvas hooked into the Celery integration: registered when this module is imported.

The integration defines the registration point (:mod:`pikku_celery.celery.extensions`)
and names no canvas module; ``from pikku_celery import Pikku`` imports this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.exceptions import Retry

from ..celery.extensions import TaskRun, register_canvas
from ..engine.execute import FinalStepError
from ..engine.task_id import TASK_ID
from ..model.values import JSON, StepState
from .added import with_additions
from .handle import CanvasRun
from .node_rules import check_arguments, is_node_step
from .replace import ADDED, StepReplaced, replaced_result
from .start import start
from .tasks import install
from .wire import decoded, encoded, exception_details

if TYPE_CHECKING:
    from ..celery.integration import Pikku


class CanvasExtension:
    """``Pikku.durable`` and the rules a canvas node's step keeps."""

    def install(self, pikku: Pikku) -> None:
        """The canvas workflow, the errback task and the result-backend writer."""
        install(pikku)

    def wrap_step(self, app: Celery, run: TaskRun) -> TaskRun:
        """A canvas node runs by Celery's rules; any step's ``self.replace(sig)``
        becomes the step's durable child canvas."""

        def canvas_run(task: Any, step: StepState) -> JSON:
            try:
                return _run_node(task, step) if is_node_step(step.name) else run(task, step)
            except StepReplaced as replaced:
                return replaced_result(app, replaced.signature, (step.route or {}).get(TASK_ID))

        return canvas_run

    def start(self, pikku: Pikku, signature: Any, idempotency_key: str | None) -> CanvasRun:
        """See :meth:`Pikku.durable`."""
        return start(pikku, signature, idempotency_key)

    def handle(self, pikku: Pikku, run_id: str) -> CanvasRun:
        """See :meth:`Pikku.durable_run`."""
        return CanvasRun(pikku, pikku.handle(run_id).run_id)


def _run_node(task: Any, step: StepState) -> JSON:
    """A node's payloads are kombu's JSON, as Celery's serializer gives them,
    and only a retry the task asked for (``self.retry``, ``autoretry_for``)
    runs it again: any other error is final."""
    try:
        check_arguments(task, step.args, step.kwargs)
        value = encoded(task.run(*decoded(step.args), **decoded(step.kwargs)))
        added = getattr(task.request, ADDED, None)
        return with_additions(value, added) if added else value
    except (StepReplaced, Retry):
        raise
    except Exception as exc:
        raise FinalStepError(exc, exception_details(exc)) from exc


register_canvas(CanvasExtension())
