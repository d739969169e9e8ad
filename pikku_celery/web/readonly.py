"""The run page over a bare store: ``pikku-celery web --database-url URL`` without ``-A``.

Reading needs only the store. Cancel, retry and signal send the run's
wake-up through the project's Celery app, and without ``-A`` there is none:
the page is read-only whatever hook it has (an action is refused with a 403
before anything is written, and the hook is asked only about reads).
"""

from __future__ import annotations

from typing import Any

from ..engine.core import WorkflowEngine
from ..errors import PikkuError, UnknownTaskError
from ..lease.memory import InMemoryLeaseService
from ..model.values import StepState
from ..ports.store import WorkflowStore
from .permissions import READ_ACTIONS, Permission

WHY = "no app (-A) to send cancel, retry or signal through"


class ReadOnlyError(PikkuError):
    """A message was to be sent by a page that has no Celery app."""


class NoDispatcher:
    """A dispatcher that knows no task and sends nothing."""

    def task_name(self, task: Any) -> str:
        raise UnknownTaskError(f"{task!r}: the read-only run page knows no tasks ({WHY})")

    def task_queue(self, task_name: str, route: dict[str, Any] | None = None) -> str | None:
        return None

    def lease_ms(self, queue: str | None) -> int:
        return 30_000

    def longest_lease_ms(self) -> int:
        return 30_000

    def max_countdown(self, queue: str | None) -> float:
        return 0.0

    def send_step(self, step: StepState, countdown: float = 0.0) -> None:
        raise ReadOnlyError(f"the run page is read-only: {WHY}")

    def wake_run(self, run_id: str, countdown: float = 0.0, reason: str = "") -> None:
        raise ReadOnlyError(f"the run page is read-only: {WHY}")


def read_only_engine(store: WorkflowStore) -> WorkflowEngine:
    """An engine over ``store`` that can read runs and send nothing."""
    return WorkflowEngine(store, InMemoryLeaseService(), NoDispatcher())


def reads_only(permission: Permission) -> Permission:
    """``permission`` for reads; every other action refused without asking it."""

    def permission_to_read(action: str, target: str) -> bool:
        return action in READ_ACTIONS and permission(action, target)

    return permission_to_read
