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
from celery.exceptions import Retry, SoftTimeLimitExceeded

from ..engine.execute import RetryStep
from ..engine.interrupt import TimeLimits
from ..engine.task_id import DELAYED, TASK_ID
from ..engine.transactional import is_transactional
from ..errors import UnknownTaskError
from ..model.values import JSON, StepState, uuid5_str
from .extensions import task_run
from .request_extras import request_fields

STEP_HEADER = "pikku_step"
"""The request header that marks a request as running a pikku step (its name)."""


def attempt_task_id(step: StepState) -> str:
    """A stable id for one attempt of a step: ``self.request.id`` in the body."""
    return uuid5_str(step.id, f"attempt-{step.attempt}")


class CeleryStepBody:
    """Calls ``task.run`` under a request describing this attempt."""

    def __init__(self, app: Celery, outer_request: Any) -> None:
        self.app = app
        self.outer = outer_request

    def under_message_limit(self) -> bool:
        """Whether the carrying message has a time limit of its own: Celery's
        timer then covers the whole task call, every eager step in it too."""
        hard, soft = _message_limits(self.outer)
        return hard is not None or soft is not None

    def time_limits(self, step: StepState) -> TimeLimits | None:
        """The task's own ``time_limit``/``soft_time_limit``, enforced here
        when no message carries them (an eager step): the soft one raises
        Celery's :class:`~celery.exceptions.SoftTimeLimitExceeded` in the body."""
        if self.under_message_limit():
            return None  # Celery enforces them on this message
        task = self.app.tasks.get(step.task_name or "")
        if task is None:
            return None
        return TimeLimits.of(task.soft_time_limit, task.time_limit, SoftTimeLimitExceeded)

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
        route = step.route or {}
        delivery_info = dict(getattr(self.outer, "delivery_info", None) or {})
        if route.get("priority") is not None:
            # Its own priority, also when it runs eagerly in another step's message.
            delivery_info["priority"] = route["priority"]
        request = {
            "id": route.get(TASK_ID) or attempt_task_id(step),
            "args": list(step.args),
            "kwargs": dict(step.kwargs),
            "retries": step.attempt - 1,
            "is_eager": True,  # self.retry() raises Retry instead of re-publishing
            "called_directly": False,
            "delivery_info": delivery_info,
            "hostname": getattr(self.outer, "hostname", None),
            "timelimit": getattr(self.outer, "timelimit", None),
            "parent_id": getattr(self.outer, "id", None),
            "root_id": step.run_id,
            "eta": _eta(step) if route.get(DELAYED) else None,
            "headers": {"pikku_run_id": step.run_id, STEP_HEADER: step.name},
        }
        request.update(request_fields(route))  # its own ids and stamps, over the defaults
        task.push_request(**request)
        run = task_run(self.app)  # through the registered features (a canvas node's rules)
        _task_stack.push(task)
        try:
            return run(task, step)
        except Retry as req:
            raise RetryStep(_countdown(req.when), req.exc) from req
        finally:
            _task_stack.pop()
            task.pop_request()


def _message_limits(request: Any) -> tuple[float | None, float | None]:
    """``(hard, soft)`` time limits of the message ``request`` carries."""
    limits = getattr(request, "timelimit", None)
    if not limits:
        return None, None
    hard, soft = (*tuple(limits), None, None)[:2]
    return hard, soft


def _eta(step: StepState) -> str:
    """When a delayed step became due (its creation), as Celery's ``request.eta``."""
    return datetime.fromtimestamp(step.created_at / 1000, UTC).isoformat()


def _countdown(when: Any) -> float | None:
    if when is None:
        return None
    if isinstance(when, datetime):
        aware = when if when.tzinfo else when.replace(tzinfo=UTC)
        return max(0.0, (aware - datetime.now(UTC)).total_seconds())
    return max(0.0, float(when))
