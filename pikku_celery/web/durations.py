"""How long runs, steps and attempts took, on the store's clock (epoch ms).

Shared by the command line's tables and the JSON every reader gets (the
run page, ``runs show --json``), so a duration means the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..engine.handle import StepHistory
from ..model.values import AttemptState, AttemptStatus, RunState, StepKind, StepState, StepStatus


def run_duration_ms(run: RunState, now: int) -> int:
    """How long the run took, or has been running so far."""
    end = run.updated_at if run.status.terminal else now
    return max(0, end - run.created_at)


def step_duration_ms(history: StepHistory, now: int) -> int | None:
    """First claim to last finish (or now); a step never claimed: its own span."""
    step, attempts = history.step, history.attempts
    if attempts:
        end = attempt_end_ms(attempts[-1], None, now)
        return None if end is None else max(0, end - attempts[0].started_at)
    if step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED):
        return max(0, step.updated_at - step.created_at)
    if step.kind == StepKind.TASK:
        return None  # still waiting for a worker
    return max(0, now - step.created_at)


def attempt_end_ms(attempt: AttemptState, later: AttemptState | None, now: int) -> int | None:
    """When the attempt stopped owning the step.

    A running attempt: now. One that lost its lease records no finish; it
    ended, at the latest, when the next attempt took over.
    """
    if attempt.finished_at is not None:
        return attempt.finished_at
    if attempt.status == AttemptStatus.RUNNING:
        return now
    return later.started_at if later is not None else None


def attempt_duration_ms(attempt: AttemptState, later: AttemptState | None, now: int) -> int | None:
    """How long the attempt owned the step (None when unknown)."""
    end = attempt_end_ms(attempt, later, now)
    return None if end is None else max(0, end - attempt.started_at)


def attempt_queued_ms(
    step: StepState,
    earlier: AttemptState | None,
    started_at: int | None = None,
    retried: Sequence[int] = (),
) -> int | None:
    """Since when the attempt's message waited for a worker, as far as the store knows.

    The first attempt's message went out when the step was recorded; a retry
    waited from the failed attempt's finish (its retry delay included), or,
    when an operator retried the failed run (``retried``: those times) before
    the attempt started at ``started_at``, from that retry: until then the
    run was failed, nobody waited. An attempt that took over a lapsed lease
    had no wait the store can tell.
    """
    if earlier is None:
        return step.created_at
    if earlier.status == AttemptStatus.SUPERSEDED or earlier.finished_at is None:
        return None
    finished = earlier.finished_at
    after = [t for t in retried if finished <= t and (started_at is None or t <= started_at)]
    return max(after, default=finished)


def with_next(attempts: Sequence[AttemptState]) -> list[tuple[AttemptState, AttemptState | None]]:
    """Each attempt beside the one that followed it (None for the last)."""
    return [(a, attempts[i + 1] if i + 1 < len(attempts) else None) for i, a in enumerate(attempts)]


def lease_remaining_ms(step: StepState, now: int) -> int | None:
    """How long the running attempt still owns the step; negative once lapsed."""
    if step.status != StepStatus.RUNNING or step.lease_expires_at is None:
        return None
    return step.lease_expires_at - now
