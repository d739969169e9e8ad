"""What a canvas node's step keeps of Celery's rules for a task in a canvas.

A workflow step is pikku's (``retries=`` retries any error); a canvas node
is Celery's: its arguments are checked against the task's signature as
``apply_async`` checks them (``task.typing``), and only a retry the task asks
for (``self.retry``, ``autoretry_for``) runs it again.
"""

from __future__ import annotations

from typing import Any

from .names import ROOT


def is_node_step(name: str | None) -> bool:
    """Whether a step is a canvas node."""
    return name is not None and (name == ROOT or name.startswith(ROOT + "."))


def check_arguments(task: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
    """Raise Celery's ``TypeError`` for arguments the task cannot take (as
    ``apply_async`` raises it before sending the task in a chain)."""
    header = getattr(task, "__header__", None) if getattr(task, "typing", False) else None
    if header is not None:
        header(*args, **kwargs)
