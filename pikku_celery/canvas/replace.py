"""``self.replace(sig)`` inside a step: the replacement becomes part of the run.

A step's body runs under an eager request (so ``self.retry()`` raises
instead of publishing), and Celery's ``Task.replace`` would then apply the
new signature in place and block on its result inside the task. pikku
wraps ``Task.replace`` once: for a request that runs a pikku step, it
checks the signature as Celery does, then raises :class:`StepReplaced`,
which the step body turns into a replacement marker (see
:mod:`pikku_celery.engine.replacement`): the signature, compiled as a
durable canvas plan, runs as a child run whose outcome is the step's. Any
other request (plain Celery) gets Celery's own ``replace``.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.task import Task
from celery.canvas import Signature, _chain
from celery.exceptions import ImproperlyConfigured

from ..celery.step_body import STEP_HEADER
from ..engine.replacement import marker
from ..model.values import JSON
from .names import WORKFLOW
from .plan import compile_plan


class StepReplaced(Exception):
    """Raised by ``self.replace(sig)`` inside a step; carries ``sig``."""

    def __init__(self, signature: Signature) -> None:
        super().__init__(f"replaced by {signature!r}")
        self.signature = signature


def in_step(task: Task) -> bool:
    """Whether ``task``'s current request runs a pikku step."""
    headers = getattr(task.request, "headers", None)
    return isinstance(headers, dict) and STEP_HEADER in headers


_celery_replace = Task.replace


def _replace(self: Task, sig: Any) -> Any:
    if not in_step(self):
        return _celery_replace(self, sig)
    if isinstance(sig, Signature) and "chord" in sig.options:
        raise ImproperlyConfigured("A signature to replace with can not be a chord")
    if isinstance(sig, _chain) and not getattr(sig, "tasks", True):
        raise ImproperlyConfigured("Cannot replace with an empty chain")
    raise StepReplaced(sig)


_celery_add_to_chord = Task.add_to_chord

ADDED = "pikku_added_to_chord"
"""The request attribute where a step's ``add_to_chord`` calls are kept."""


def _add_to_chord(self: Task, sig: Any, lazy: bool = False) -> Any:
    """``Task.add_to_chord`` in a step: compiled, kept on the request for
    the step body to record (see :mod:`.added`); returns the frozen result."""
    if not in_step(self):
        return _celery_add_to_chord(self, sig, lazy)
    result = sig.freeze()
    plan = compile_plan(self.app, sig, result.id)
    added = getattr(self.request, ADDED, None)
    if added is None:
        added = []
        setattr(self.request, ADDED, added)
    added.append(plan)
    return sig if lazy else result


def install_replace() -> None:
    """Wrap ``Task.replace`` and ``Task.add_to_chord`` (once per process) as
    the module and :mod:`.added` say."""
    if Task.replace is not _replace:
        Task.replace = _replace
    if Task.add_to_chord is not _add_to_chord:
        Task.add_to_chord = _add_to_chord


def replaced_result(app: Celery, signature: Signature, task_id: str | None) -> JSON:
    """The step result that says: this step is ``signature``'s durable run,
    whose result keeps the replaced task's id (``task_id``), as in Celery."""
    return marker(WORKFLOW, compile_plan(app, signature, task_id))
