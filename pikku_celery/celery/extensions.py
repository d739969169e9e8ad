"""The registration point through which features built on the integration hook into it.

Durable canvas (:mod:`pikku_celery.canvas`) builds on the integration, which
names no feature: a feature registers here when it is imported (importing
``Pikku`` from ``pikku_celery`` imports canvas), every ``Pikku`` made after
that installs it, and a step's task body runs through its wrapper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from celery import Celery

from ..engine.handle import RunHandle
from ..model.values import JSON, StepState

if TYPE_CHECKING:
    from .integration import Pikku

TaskRun = Callable[[Any, StepState], JSON]
"""Runs a step's task body: ``run(task, step)`` gives the step's result."""


class Extension(Protocol):
    """A feature built on the integration."""

    def install(self, pikku: Pikku) -> None:
        """Register what the feature needs on a new ``Pikku`` (tasks, workflows, observers)."""
        ...

    def wrap_step(self, app: Celery, run: TaskRun) -> TaskRun:
        """The step body's task call as this feature runs it (``run`` otherwise)."""
        ...


class DurableCanvas(Extension, Protocol):
    """The feature behind ``Pikku.durable``: a Celery canvas stored as one run."""

    def start(self, pikku: Pikku, signature: Any, idempotency_key: str | None) -> RunHandle[Any]:
        """Check ``signature`` whole, store it as a run, take its first pass."""
        ...

    def handle(self, pikku: Pikku, run_id: str) -> RunHandle[Any]:
        """The handle of a durable canvas's run."""
        ...


_extensions: list[Extension] = []
_canvas: list[DurableCanvas] = []


def register(extension: Extension) -> None:
    """Install ``extension`` into every ``Pikku`` made from now on (once, however
    often it is registered)."""
    if extension not in _extensions:
        _extensions.append(extension)


def register_canvas(canvas: DurableCanvas) -> None:
    """Register the feature ``Pikku.durable`` starts canvases with."""
    register(canvas)
    _canvas[:] = [canvas]


def registered() -> tuple[Extension, ...]:
    """The features registered so far, in order."""
    return tuple(_extensions)


def durable_canvas() -> DurableCanvas:
    """The registered canvas feature; an error naming its module when none is."""
    if not _canvas:
        raise RuntimeError(
            "durable canvas is not registered: import Pikku from pikku_celery "
            "(or import pikku_celery.canvas.extension) before making it"
        )
    return _canvas[0]


def task_run(app: Celery) -> TaskRun:
    """The task call of a step body: the task's own ``run``, through each feature's wrapper."""
    run: TaskRun = _call
    for extension in _extensions:
        run = extension.wrap_step(app, run)
    return run


def _call(task: Any, step: StepState) -> JSON:
    return task.run(*step.args, **step.kwargs)
