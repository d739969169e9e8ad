"""Who may do what on the run page: the permission hook and its actions.

The hook is the contract of :mod:`pikku_celery.contrib.flask`'s blueprint:
``permission(action, target) -> bool``, asked before anything is read or
looked up, so a refused caller learns nothing (not even whether a run
exists). The run page asks it for:

- ``"list"`` (target ``"runs"``): the runs list and its counts;
- ``"status"`` (target: the run id as the request spelt it): one run;
- ``"cancel"``, ``"retry"``, ``"signal"`` (target: the run id): the actions;
- ``"cancel"``, ``"retry"`` (target ``"runs"``): a bulk action, before it picks
  runs; then each picked run is asked about by its id.

The page shows an action's button only when the hook allows it for that run.
"""

from __future__ import annotations

from collections.abc import Callable

Permission = Callable[[str, str], bool]
"""``permission(action, target) -> bool``: may this request do ``action`` on ``target``?"""

READ_ACTIONS = ("list", "status")
"""What reading the page asks for."""

STEER_ACTIONS = ("cancel", "retry", "signal")
"""What the page's buttons ask for."""

LIST_TARGET = "runs"
"""The target of ``"list"``."""


def read_only(action: str, target: str) -> bool:
    """The hook of a page nobody steers from: reading only."""
    return action in READ_ACTIONS


def allow_all(action: str, target: str) -> bool:
    """The hook of a page whose every visitor may steer (a loopback operator's)."""
    return True


def allowed_actions(permission: Permission, run_id: str) -> dict[str, bool]:
    """Which of the page's actions ``permission`` allows on the run."""
    return {action: bool(permission(action, run_id)) for action in STEER_ACTIONS}
