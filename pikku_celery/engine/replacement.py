"""A step replaced by another run: Celery's ``self.replace(sig)`` made durable.

A task that calls ``self.replace(sig)`` inside a step does not run ``sig``
there and then (Celery would, for an eager request, and block on it). Its
step succeeds with a *replacement marker* instead: the run to start in its
place (a workflow name and its input). Whoever joins the step then starts
that run as a child step named after it (``<step>~replaced``) and takes the
child's outcome as the step's own. The marker is stored before anything of
the replacement runs, so a worker killed midway leaves a run that resumes:
the child is an ordinary child run whose steps have their own attempts.
"""

from __future__ import annotations

import re
from typing import Any

from ..model.values import JSON

MARKER = "__pikku_replaced_by__"
"""The one key of a step result that says "my value is this run's output"."""

SUFFIX = "~replaced"
"""The suffix of the child step that runs a replaced step's replacement."""

_NESTED = re.compile(
    r"(?:child workflow run \S+ failed: )?(?:step '[^']+' failed: )?"
    r"(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)",
    re.S,
)


def marker(workflow: str, input: JSON) -> dict[str, JSON]:
    """A step result saying the step is replaced by a run of ``workflow`` on ``input``."""
    return {MARKER: {"workflow": workflow, "input": input}}


def replacement(result: Any) -> tuple[str, JSON] | None:
    """``(workflow, input)`` if ``result`` is a replacement marker, else None."""
    if isinstance(result, dict) and len(result) == 1 and MARKER in result:
        inner = result[MARKER]
        if isinstance(inner, dict) and isinstance(inner.get("workflow"), str):
            return inner["workflow"], inner.get("input")
    return None


def unwrapped(error: dict[str, Any]) -> tuple[str, str, str]:
    """The task error inside a replacement run's failure: ``type``,
    ``message``, ``traceback`` of the step that failed (nested replacements
    included), as the replaced step would have raised it."""
    kind = str(error.get("type", "Error"))
    message = str(error.get("message", ""))
    while kind == "StepFailedError":
        found = _NESTED.fullmatch(message)
        if found is None:
            break
        kind, message = found["type"], found["message"]
    return kind, message, str(error.get("traceback", ""))
