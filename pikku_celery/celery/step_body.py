"""Running the user's own task as a step, inside pikku's run-step task.

The task keeps what the user set on it: its body runs with a real
``self.request`` (an id per attempt, ``retries`` = attempts so far), and
``self.retry()`` becomes the step's retry: the request is marked eager so
Celery raises :class:`celery.exceptions.Retry` instead of publishing a second
message, and pikku schedules the next attempt itself.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from celery import Celery
from celery._state import _task_stack
from celery.exceptions import Retry

from ..canvas.node_rules import check_arguments, is_node_step
from ..engine.execute import FinalStepError, RetryStep
from ..engine.transactional import is_transactional
from ..errors import UnknownTaskError
from ..store.model import JSON, StepState, uuid5_str


def attempt_task_id(step: StepState) -> str:
    """A stable id for one attempt of a step: ``self.request.id`` in the body."""
    return uuid5_str(step.id, f"attempt-{step.attempt}")


class CeleryStepBody:
    """Calls ``task.run`` under a request describing this attempt."""

    def __init__(self, app: Celery, outer_request: Any) -> None:
        self.app = app
        self.outer = outer_request

    def transactional(self, step: StepState) -> bool:
        """Whether the task asked to run inside the step's store transaction."""
        task = self.app.tasks.get(step.task_name or "")
        return task is not None and (is_transactional(task) or is_transactional(task.run))

    def __call__(self, step: StepState) -> JSON:
        task = self.app.tasks.get(step.task_name or "")
        if task is None:
            raise UnknownTaskError(
                f"task {step.task_name!r} is not registered in this worker's Celery app"
            )
        task.push_request(
            id=attempt_task_id(step),
            args=list(step.args),
            kwargs=dict(step.kwargs),
            retries=step.attempt - 1,
            is_eager=True,  # self.retry() raises Retry instead of re-publishing
            called_directly=False,
            delivery_info=getattr(self.outer, "delivery_info", None) or {},
            hostname=getattr(self.outer, "hostname", None),
            timelimit=getattr(self.outer, "timelimit", None),
            parent_id=getattr(self.outer, "id", None),
            root_id=step.run_id,
            headers={"pikku_run_id": step.run_id, "pikku_step": step.name},
        )
        _task_stack.push(task)
        try:
            if is_node_step(step.name):
                check_arguments(task, step.args, step.kwargs)
            return task.run(*step.args, **step.kwargs)
        except Retry as req:
            raise RetryStep(_countdown(req.when), req.exc) from req
        except Exception as exc:
            if is_node_step(step.name):
                # A canvas node keeps Celery's rule: only a retry the task
                # asked for (self.retry, autoretry_for) runs it again.
                raise FinalStepError(exc) from exc
            raise
        finally:
            _task_stack.pop()
            task.pop_request()


def _countdown(when: Any) -> float | None:
    if when is None:
        return None
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max(0.0, (aware - datetime.now(UTC)).total_seconds())
    return max(0.0, float(when))
