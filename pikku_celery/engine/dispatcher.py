"""The dispatcher port: how the engine reaches workers (Celery, or a test loop)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from ..model.values import StepState


@runtime_checkable
class Dispatcher(Protocol):
    """Sends messages; knows tasks and queues. Never decides ownership."""

    def task_name(self, task: Any) -> str:
        """The registered name of ``task`` (a task object or a name).

        Raises :class:`UnknownTaskError` for a task workers cannot run.
        """
        ...

    def task_queue(self, task_name: str, route: dict[str, Any] | None = None) -> str | None:
        """The queue a step of this task lands on: by default, or with the
        routing options ``route`` of ``ctx.step`` (queue, exchange,
        routing_key, priority). None when only the broker knows."""
        ...

    def lease_ms(self, queue: str | None) -> int:
        """The step lease on ``queue``: never beyond the broker's redelivery horizon."""
        ...

    def longest_lease_ms(self) -> int:
        """The longest step lease any queue grants (the engine's default bound on
        the leases it trusts is a multiple of it)."""
        ...

    def max_countdown(self, queue: str | None) -> float:
        """The longest countdown (seconds) that is safe on ``queue``.

        Longer waits are stored and woken by the sweep instead.
        """
        ...

    def send_step(self, step: StepState, countdown: float = 0.0) -> None:
        """Send the run-step message for the step's current attempt.

        A message carries the trace context :data:`~.observe.run_trace` holds
        when it is sent (if any) to the worker's ``execute_step(..., trace=)``;
        the same for :meth:`wake_run` and ``orchestrate``."""
        ...

    def wake_run(self, run_id: str, countdown: float = 0.0, reason: str = "") -> None:
        """Ask for an orchestration pass of the run."""
        ...


@runtime_checkable
class EagerDispatch(Protocol):
    """A dispatcher that can say a step may run right here, with no message
    (eager steps). Optional: a dispatcher without it publishes every step."""

    def eager_body(
        self, task_name: str, queue: str | None, carrier: Callable[[StepState], Any]
    ) -> Callable[[StepState], Any] | None:
        """The body that runs a step of ``task_name`` on ``queue`` in this
        process now, or None if it must travel as a message (its task is not
        here, its queue is not consumed here, Celery enforces a limit per
        message on it, the worker is shutting down). ``carrier`` is the body
        of the step whose worker asks."""
        ...
