"""The memory store's reads of a long history a piece at a time, as the SQL store's answer them."""

from __future__ import annotations

from dataclasses import replace

from ..model.values import AttemptState, StepState


class MemoryPages:
    """Outlines and pages of a run's steps, from the memory store's own reads
    (:class:`~.memory.InMemoryWorkflowStore` provides them)."""

    def get_steps(self, run_id: str) -> list[StepState]:
        """Every step of the run, in order (the store's own)."""
        raise NotImplementedError

    def get_attempts(self, run_id: str) -> list[AttemptState]:
        """Every attempt of the run, oldest first (the store's own)."""
        raise NotImplementedError

    def get_step_outlines(self, run_id: str) -> list[StepState]:
        """The run's steps in order, their payloads left empty."""
        return [
            replace(s, args=[], kwargs={}, result=None, error=None, route=None)
            for s in self.get_steps(run_id)
        ]

    def get_steps_page(self, run_id: str, after_seq: int | None, limit: int) -> list[StepState]:
        """A page of the run's steps, in order, after ``after_seq``."""
        low = -1 if after_seq is None else after_seq
        return [s for s in self.get_steps(run_id) if s.seq > low][:limit]

    def get_attempts_page(
        self, run_id: str, after_seq: int | None, through_seq: int
    ) -> list[AttemptState]:
        """The attempts of one page of the run's steps, oldest first."""
        low = -1 if after_seq is None else after_seq
        ids = {s.id for s in self.get_steps(run_id) if low < s.seq <= through_seq}
        return [a for a in self.get_attempts(run_id) if a.step_id in ids]
