"""What the engine tells its observers (metrics, traces), as it happens.

An observer sees what only the worker process knows: how long a body ran,
which writes were refused, what a sweep woke. Observers never break the
engine: one that raises is logged and the engine goes on.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..store.model import RunState, StepOutcome, StepState

if TYPE_CHECKING:
    from .sweep import SweepReport

log = logging.getLogger(__name__)


class EngineObserver:
    """Override what you need; every method does nothing by default."""

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        """An attempt's body ran and its outcome was recorded. ``step`` is the
        step as claimed (its queue, task, attempt; ``scheduled_at`` and
        ``updated_at`` give its wait for a worker on the store's clock)."""

    def write_refused(self, step_id: str, attempt: int, claim_lost: bool) -> None:
        """An outcome of a superseded attempt (or of a lost claim) was refused."""

    def run_settled(self, run: RunState) -> None:
        """A pass of this process ended the run."""

    def swept(self, report: SweepReport) -> None:
        """A sweep ran; ``report`` says what it woke, by reason."""


class Observers(EngineObserver):
    """Every observer of one engine, each told in turn."""

    def __init__(self) -> None:
        self._observers: list[EngineObserver] = []

    def add(self, observer: EngineObserver) -> None:
        """Tell ``observer`` from now on."""
        self._observers.append(observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        for observer in self._observers:
            self._tell(observer.step_attempted, step, outcome, run_seconds)

    def write_refused(self, step_id: str, attempt: int, claim_lost: bool) -> None:
        for observer in self._observers:
            self._tell(observer.write_refused, step_id, attempt, claim_lost)

    def run_settled(self, run: RunState) -> None:
        for observer in self._observers:
            self._tell(observer.run_settled, run)

    def swept(self, report: SweepReport) -> None:
        for observer in self._observers:
            self._tell(observer.swept, report)

    @staticmethod
    def _tell(method: object, *args: object) -> None:
        try:
            method(*args)  # type: ignore[operator]
        except Exception:
            log.exception("an engine observer failed (ignored)")
