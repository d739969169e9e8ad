"""The dispatcher port: how the engine reaches workers (Celery, or a test loop)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..store.model import StepState


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
        """The step lease on ``queue``: the broker's redelivery horizon."""
        ...

    def longest_lease_ms(self) -> int:
        """The longest step lease any queue grants (bounds leases the sweep trusts)."""
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
