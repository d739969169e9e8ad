"""The sweep: nothing is parked forever, even if the broker forgets everything.

Each call handles a bounded batch from indexed queries, holds a lease of its
own so overlapping sweeps do not double the work, and backs off per run so a
wedged run cannot flood the queue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, LeaseTakenError
from ..lease import hold_lease
from ..store.model import StepKind

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

SWEEP_LEASE_KEY = "pikku-sweep"


@dataclass
class SweepReport:
    """What one sweep did, by kind; ``skipped`` when another sweep held the lease."""

    requeued_lapsed: int = 0  # running steps whose worker vanished: sent again
    expired: int = 0  # ... with no attempts left: failed
    resent: int = 0  # scheduled steps whose message may be lost
    due: int = 0  # timers, signal timeouts and retries that came due
    idle: int = 0  # runs with nothing in flight and no progress
    skipped: bool = False  # another sweep held the sweep lease

    @property
    def total(self) -> int:
        """Everything the sweep acted on (the log line is written only when non-zero)."""
        return self.requeued_lapsed + self.expired + self.resent + self.due + self.idle


def sweep(engine: WorkflowEngine, limit: int = 200) -> SweepReport:
    """One sweep pass under the sweep lease, so two beats never double the work."""
    report = SweepReport()
    with engine.observers.sweeping():
        try:
            with hold_lease(
                engine.leases, SWEEP_LEASE_KEY, engine.sweep_lease_ttl, engine.worker_id
            ):
                _sweep(engine, limit, report)
        except LeaseTakenError:
            report.skipped = True
        except LeaseLostError as exc:
            log.warning("sweep: %s", exc)
        if report.total:
            log.info("sweep: %s", report)
        engine.observers.swept(report)
    return report


def _sweep(engine: WorkflowEngine, limit: int, report: SweepReport) -> None:
    store, dispatcher = engine.store, engine.dispatcher
    backoff_ms = round(engine.sweep_backoff * 1000)
    max_backoff_ms = round(engine.sweep_max_backoff * 1000)
    # A lease lapses when its own expiry passes; one ending beyond what any
    # worker of the fleet grants was never granted (an edited row, a clock
    # set back) and counts as lapsed too.
    bound_ms = engine.lease_bound_ms()

    def may_touch(run_id: str) -> bool:
        return store.note_swept(run_id, backoff_ms, max_backoff_ms)

    for step in store.lapsed_steps(limit, bound_ms):
        if not may_touch(step.run_id):
            continue
        if step.attempt >= step.max_attempts:
            if store.expire_step(step.id, bound_ms):
                report.expired += 1
                dispatcher.wake_run(step.run_id, reason="lease-expired")
        else:
            dispatcher.send_step(step)  # the claim takes it over as attempt + 1
            report.requeued_lapsed += 1
    grace_ms = round(engine.message_grace * 1000)
    for step in store.undispatched_steps(grace_ms, limit):
        if not may_touch(step.run_id):
            continue
        dispatcher.send_step(step)
        store.mark_scheduled([step.id])
        report.resent += 1
    for step in store.due_steps(limit):
        if not may_touch(step.run_id):
            continue
        if step.kind == StepKind.TASK:
            dispatcher.send_step(step)
            store.mark_scheduled([step.id])
        else:
            dispatcher.wake_run(step.run_id, reason="timer")
        report.due += 1
    for run in store.idle_runs(round(engine.idle_after * 1000), limit):
        if not may_touch(run.id):
            continue
        dispatcher.wake_run(run.id, reason="idle")
        report.idle += 1
