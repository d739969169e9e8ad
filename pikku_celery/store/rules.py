"""The ownership and sweep rules every store judges the same way."""

from __future__ import annotations

from ..errors import SignalAlreadySentError
from ..model.changes import run_cancelled_error
from ..model.values import JSON, ErrorInfo

__all__ = ["run_cancelled_error"]  # the engine closes a cancelled run's steps with it

LEASE_BOUND_FACTOR = 2
"""The default fleet bound on leases: this many of the longest lease (or horizon)
the configuration knows, so a lease granted under a longer setting during a
rolling deploy is still trusted, and one set further ahead than that is not."""


def lease_lapsed(lease_expires_at: int | None, now: int, bound_ms: int | None = None) -> bool:
    """Whether a running step's lease no longer protects it.

    Lapsed when it ended, or when it ends further ahead than ``bound_ms``:
    no worker is ever granted that (an edited row), and waiting for it would
    park the run for as long. A NULL lease (a parked step) never lapses.
    """
    if lease_expires_at is None:
        return False
    return lease_expires_at <= now or (bound_ms is not None and lease_expires_at > now + bound_ms)


def check_resent(run_id: str, name: str, sent: object, payload: JSON) -> None:
    """A signal of a name already sent is taken only as a resend of the same
    payload (a client retrying): the first one stays, and a different one is
    refused rather than dropped unseen."""
    if sent != payload:
        raise SignalAlreadySentError(
            f"workflow run {run_id} already has signal {name!r} with another payload; "
            "a signal name is delivered once (send another name for a new value)"
        )


SWEEP_BACKOFF_DOUBLINGS = 16
"""The sweep's per-run backoff doubles at most this many times (then the cap holds)."""


def sweep_backoff_ms(base_ms: int, sweep_count: int, max_ms: int) -> int:
    """The wait before the sweep may wake a run again, after ``sweep_count``
    wake-ups with no pass in between: ``base * 2 ** count``, at most ``max_ms``."""
    doublings: int = min(sweep_count, SWEEP_BACKOFF_DOUBLINGS)
    return min(base_ms * (1 << doublings), max_ms)


def sweep_order(next_sweep_at: int, own_ms: int, now: int) -> int | None:
    """Where a step stands in the sweep's order, or None while its backoff runs.

    A step never re-sent stands at its own time (its lease's end, when its
    message was sent, when it came due); one re-sent stands at the end of its
    backoff, behind what has waited longer, so re-sending it again and again
    can never keep another step out of a batch.
    """
    if next_sweep_at == 0:  # never re-sent
        return own_ms
    return next_sweep_at if next_sweep_at <= now else None


def lease_expired_error(step_name: str, attempts: int) -> ErrorInfo:
    """The error a step gets when its worker was lost on its last attempt."""
    return {
        "type": "WorkflowStepLeaseExpiredError",
        "message": (
            f"step {step_name!r} lost its worker (lease lapsed) on each of its "
            f"{attempts} attempt(s)"
        ),
        "traceback": "",
    }
