"""What a schedule asks of the engine that drives it, as protocols.

Schedules sit below the engine (the engine defines and ticks them), so they
name it by what they use, never by its class.
"""

from __future__ import annotations

from typing import Protocol

from ..model.values import JSON, Operator, RunState
from ..ports.store import WorkflowStore
from .model import Schedule


class Named(Protocol):
    """A workflow, as a schedule names it."""

    @property
    def name(self) -> str:
        """The workflow's registered name."""
        ...


class Started(Protocol):
    """A started run, as a tick keeps it."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...


class ScheduleHost(Protocol):
    """The engine, as schedules use it: its registry of schedules, its input
    check, its store, and starting and cancelling runs."""

    schedules: dict[str, Schedule]

    @property
    def store(self) -> WorkflowStore:
        """Where runs are kept: a tick looks up the run its key named."""
        ...

    def check_input(self, value: JSON, where: str, path: str) -> str:
        """``value`` as stored JSON, or an error naming ``where`` and ``path``."""
        ...

    def start(
        self, workflow: str, input: JSON = None, *, idempotency_key: str | None = None
    ) -> Started:
        """Start a run of ``workflow`` (see ``WorkflowEngine.start``)."""
        ...

    def cancel(self, run_id: str, *, by: Operator | None = None) -> RunState:
        """Ask a run to end as cancelled (see ``WorkflowEngine.cancel``)."""
        ...
