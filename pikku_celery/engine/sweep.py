"""The sweep: nothing is parked forever, even if the broker forgets everything.

Each call holds a lease of its own so overlapping sweeps do not double the
work. Its queries find only steps it can act on, a page at a time: every step
it re-sends starts a backoff of its own (per step, so a run's whole fan-out
comes back in one sweep) and comes back behind the steps that waited longer,
so steps it cannot get taken (no worker has their task) never fill a page and
starve the rest. Runs it wakes for being idle back off per run.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, LeaseTakenError
from ..lease import hold_lease
from ..model.values import StepKind, StepState
from .admission import heal_slots

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
    admitted: int = 0  # queued runs given the concurrency slot a settled run left
    overdue: int = 0  # runs past their deadline: woken, so that their pass fails them
    skipped: bool = False  # another sweep held the sweep lease

    @property
    def total(self) -> int:
        """Everything the sweep acted on (the log line is written only when non-zero)."""
        return (
            self.requeued_lapsed
            + self.expired
            + self.resent
            + self.due
            + self.idle
            + self.admitted
            + self.overdue
        )


SWEEP_MAX_PAGES = 50
"""Pages of each query one sweep reads at most: bounds a sweep's time; what is
left is read first by the next sweep, since what this one re-sent went last."""


def sweep(
    engine: WorkflowEngine, limit: int = 200, max_pages: int = SWEEP_MAX_PAGES
) -> SweepReport:
    """One sweep pass under the sweep lease, so two beats never double the work."""
    report = SweepReport()
    with engine.observers.sweeping():
        try:
            # one holder per call: two sweeps of one process (threads) do not
            # share the lease, so the second stands aside as another host's would
            holder = f"{engine.worker_id}/{uuid.uuid4().hex[:12]}"
            with hold_lease(engine.leases, SWEEP_LEASE_KEY, engine.sweep_lease_ttl, holder):
                _sweep(engine, limit, max_pages, report)
        except LeaseTakenError:
            report.skipped = True
        except LeaseLostError as exc:
            log.warning("sweep: %s", exc)
        if report.total:
            log.info("sweep: %s", report)
        engine.observers.swept(report)
    return report


def _sweep(engine: WorkflowEngine, limit: int, max_pages: int, report: SweepReport) -> None:
    store, dispatcher = engine.store, engine.dispatcher
    backoff_ms = round(engine.sweep_backoff * 1000)
    max_backoff_ms = round(engine.sweep_max_backoff * 1000)
    # A lease lapses when its own expiry passes; one ending beyond what any
    # worker of the fleet grants was never granted (an edited row, a clock
    # set back) and counts as lapsed too.
    bound_ms = engine.lease_bound_ms()
    woken: set[str] = set()

    def wake(run_id: str, reason: str) -> None:
        if run_id not in woken:  # one message wakes a run for all its steps
            woken.add(run_id)
            dispatcher.wake_run(run_id, reason=reason)

    def pages(read: Callable[[], list[StepState]]) -> Iterator[list[StepState]]:
        """Pages of ``read``; each page, once handled, starts its steps' backoff,
        which takes them out of the next read: the walk moves on."""
        seen: set[str] = set()
        for _ in range(max_pages):
            found = read()
            page = [s for s in found if s.id not in seen]
            if not page:
                return
            seen.update(s.id for s in page)
            yield page
            store.note_steps_swept([s.id for s in page], backoff_ms, max_backoff_ms)
            if len(found) < limit:
                return

    for page in pages(lambda: store.lapsed_steps(limit, bound_ms)):
        for step in page:
            if step.attempt < step.max_attempts:
                dispatcher.send_step(step)  # the claim takes it over as attempt + 1
                report.requeued_lapsed += 1
            elif store.expire_step(step.id, bound_ms, run_id=step.run_id):
                report.expired += 1
                wake(step.run_id, "lease-expired")
    grace_ms = round(engine.message_grace * 1000)
    for page in pages(lambda: store.undispatched_steps(grace_ms, limit)):
        for step in page:
            dispatcher.send_step(step)
        store.mark_scheduled([s.id for s in page])
        report.resent += len(page)
    for page in pages(lambda: store.due_steps(limit)):
        tasks = [s for s in page if s.kind == StepKind.TASK]
        for step in page:
            if step.kind == StepKind.TASK:
                dispatcher.send_step(step)
            else:
                wake(step.run_id, "timer")
        store.mark_scheduled([s.id for s in tasks])
        report.due += len(page)
    for run in store.idle_runs(round(engine.idle_after * 1000), limit):
        if not store.note_swept(run.id, backoff_ms, max_backoff_ms):
            continue
        dispatcher.wake_run(run.id, reason="idle")
        report.idle += 1
    report.admitted += heal_slots(engine, limit, grace_ms)
    # Runs past their deadline: their pass fails them. Each is backed off
    # like an idle run, which takes it out of the next page's read.
    swept: set[str] = set()
    for _ in range(max_pages):
        overdue = store.overdue_runs(limit)
        fresh = [r.id for r in overdue if r.id not in swept]
        swept.update(fresh)
        for run_id in fresh:
            if store.note_swept(run_id, backoff_ms, max_backoff_ms):
                wake(run_id, "deadline")
                report.overdue += 1
        if not fresh or len(overdue) < limit:
            break
