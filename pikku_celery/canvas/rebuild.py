"""A failed canvas task's exception, made again as Celery's result backend makes it."""

from __future__ import annotations

import ast
import builtins
import contextlib
import sys
from typing import Any

import celery.exceptions
from celery import Celery

from .wire import decoded


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
    args = error.get("args")
    made_with = tuple(decoded(args)) if isinstance(args, list) else (message,)
    for place in places:
        cls = getattr(place, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                rebuilt: BaseException = cls(*made_with)
            except Exception:
                break
            return rebuilt
    unknown: type[Exception] = type(name, (Exception,), {"__module__": "pikku_celery.canvas"})
    return unknown(message)
