"""The memory store's step addressed by its id: read, lease renewal, expiry.

As the SQL store's pinned statements answer them: a step named with a run it
is not of reads as none and is never touched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..model.changes import fence_holds, step_closed
from ..model.values import AttemptState, AttemptStatus, StepState, StepStatus
from .rules import lease_expired_error, lease_lapsed


class MemoryStepLeases:
    """A step's read, its renewal and its expiry (the dicts are the store's
    own: :class:`~.memory.InMemoryWorkflowStore`)."""

    _clock: Callable[[], int]
    _lock: threading.RLock
    _steps: dict[str, StepState]
    _attempts: dict[str, list[AttemptState]]

    def get_step(self, step_id: str, *, run_id: str | None = None) -> StepState | None:
        """The step, or None if there is no step with that id (in that run)."""
        with self._lock:
            return self._step_of(step_id, run_id)

    def _step_of(self, step_id: str, run_id: str | None) -> StepState | None:
        """The step, if it is one of run ``run_id`` (None: of any run)."""
        step = self._steps.get(step_id)
        if step is None or (run_id is not None and step.run_id != run_id):
            return None
        return step

    def _set_attempt(self, step_id: str, attempt: int, **changes: Any) -> None:
        rows = self._attempts.setdefault(step_id, [])
        for i, row in enumerate(rows):
            if row.attempt == attempt:
                rows[i] = replace(row, **changes)
                return

    def refresh_step_lease(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int | None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> bool:
        with self._lock:
            step = self._step_of(step_id, run_id)
            now = self._clock()
            if (
                step is None
                or not fence_holds(step, attempt, claim_id)
                or (step.lease_expires_at is not None and step.lease_expires_at <= now)
            ):
                return False
            expires = None if lease_ms is None else now + lease_ms
            self._steps[step_id] = replace(step, lease_expires_at=expires, updated_at=now)
            if lease_ms is not None:
                self._count_renewal(step_id, attempt, now)
            return True

    def _count_renewal(self, step_id: str, attempt: int, now: int) -> None:
        attempts = self._attempts.get(step_id, [])
        for i, found in enumerate(attempts):
            if found.attempt == attempt:
                attempts[i] = replace(found, renewals=found.renewals + 1, renewed_at=now)

    def expire_step(
        self, step_id: str, bound_ms: int | None = None, *, run_id: str | None = None
    ) -> bool:
        with self._lock:
            step = self._step_of(step_id, run_id)
            now = self._clock()
            if (
                step is None
                or step.status != StepStatus.RUNNING
                or not lease_lapsed(step.lease_expires_at, now, bound_ms)
                or step.attempt < step.max_attempts
            ):
                return False
            err = lease_expired_error(step.name, step.attempt)
            self._steps[step_id] = step_closed(step, err, now)
            self._set_attempt(
                step_id,
                step.attempt,
                status=AttemptStatus.LEASE_EXPIRED,
                error=err,
                finished_at=now,
            )
            return True
