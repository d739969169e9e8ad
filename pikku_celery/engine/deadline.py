"""Run deadlines: a run started with a timeout fails once it passes.

The deadline is written with the run (its creation time plus the timeout,
both on the store's clock) and judged by every pass against the pass's own
reading of that clock, so no worker's clock decides it. A run that nothing
wakes (a step that hangs, a long sleep) is woken at its deadline by its own
timer, and failing that by the sweep (``SweepReport.overdue``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

from ..model.values import Decision, ErrorInfo, RunStatus, RunView, StepKind

DEADLINE_ERROR = "WorkflowDeadlineError"
"""The error type a run past its deadline, and each step it closes, record."""


def run_timeout_ms(timeout: float | timedelta) -> int:
    """A run's ``timeout=`` in milliseconds; refused unless positive and finite."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a workflow timeout must be more than 0 seconds, got {timeout!r}")
    return max(1, round(seconds * 1000))


def overdue(view: RunView) -> bool:
    """Whether the run's deadline passed, as of the pass's reading of the store's clock."""
    deadline = view.run.deadline_at
    return deadline is not None and view.now >= deadline


def timed_out(view: RunView) -> Decision:
    """Fail the run for its deadline: its open steps closed, its live children
    asked to stop (each ends cancelled, which its own pass records)."""
    deadline = view.run.deadline_at
    late = 0 if deadline is None else view.now - deadline
    error: ErrorInfo = {
        "type": DEADLINE_ERROR,
        "message": f"workflow run {view.run.id} passed its deadline ({late} ms ago)",
        "traceback": "",
    }
    children = [
        s.child_run_id
        for s in view.steps
        if s.kind == StepKind.CHILD and s.child_run_id is not None and not s.settled
    ]
    closed: ErrorInfo = {
        "type": DEADLINE_ERROR,
        "message": f"its workflow run {view.run.id} passed its deadline",
        "traceback": "",
    }
    return Decision(
        run_status=RunStatus.FAILED, error=error, cancel_children=children, close_open=closed
    )


def wake_by_deadline(view: RunView, decision: Decision) -> Decision:
    """A run that goes on waiting is looked at again by its deadline at the latest."""
    deadline = view.run.deadline_at
    if deadline is None or decision.run_status is not None:
        return decision
    if decision.wake_at is None or decision.wake_at > deadline:
        return replace(decision, wake_at=deadline)
    return decision
