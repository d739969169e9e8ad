"""Retention: settled run trees older than the retention leave the store.

The loop over the store's batches (:class:`~pikku_celery.store.prune.RunPruning`):
each batch is its own short transaction, so a prune stopped anywhere (its
time budget spent, its process killed) has deleted whole trees or nothing of
a tree, and the next prune carries on. The beat's prune holds a lease of its
own, so two beats never prune at once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING

from ..errors import LeaseLostError, LeaseTakenError
from ..lease import hold_lease
from ..model.values import RunStatus
from ..store.prune import PruneBatch, PruneCounts, PruneQuery, RunPruning

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

PRUNE_LEASE_KEY = "pikku-prune"
PRUNE_LEASE_TTL = 30.0
"""Seconds of the prune lease (renewed while a prune runs): a beat whose
worker died mid-prune is followed by the next within this."""

DEFAULT_BATCH_SIZE = 500
TICK_SECONDS = 20.0
"""The beat's prune stops starting batches after this long (one batch more at
most): what is left is the next tick's."""


def retention_ms(retention: timedelta | float) -> int:
    """A retention (a ``timedelta``, or seconds) as milliseconds; refuses a
    negative one, which would prune runs that have not settled yet."""
    seconds = retention.total_seconds() if isinstance(retention, timedelta) else float(retention)
    if not seconds >= 0:
        raise ValueError(f"retention must be 0 or more, not {retention!r}")
    return round(seconds * 1000)


def describe_retention(retention: timedelta | None) -> str:
    """What the run page and ``runs show`` say about how long runs are kept."""
    if retention is None:
        return "runs are kept for good (no retention set)"
    seconds = retention.total_seconds()
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"runs are kept {n} {unit}{'s' if n != 1 else ''} after they settle"
    return f"runs are kept {seconds:g} seconds after they settle"


@dataclass
class PruneReport:
    """What a prune did (or, dry, would do): rows by kind, trees, batches,
    whether it reached the end, and its longest batch (ms, locks held)."""

    counts: PruneCounts = field(default_factory=PruneCounts)
    trees: int = 0
    batches: int = 0
    looked_at: int = 0
    finished: bool = False
    dry_run: bool = False
    skipped: bool = False  # another prune held the prune lease
    seconds: float = 0.0
    max_held_ms: float = 0.0

    def as_dict(self) -> dict[str, object]:
        """The report as JSON-ready data (the task's result, ``--json``)."""
        return {
            "runs": self.counts.runs,
            "steps": self.counts.steps,
            "attempts": self.counts.attempts,
            "signals": self.counts.signals,
            "audit": self.counts.audit,
            "leases": self.counts.leases,
            "trees": self.trees,
            "batches": self.batches,
            "looked_at": self.looked_at,
            "finished": self.finished,
            "dry_run": self.dry_run,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
            "max_held_ms": round(self.max_held_ms, 3),
        }


def prune_query(
    store: RunPruning,
    now_ms: int,
    older_than: timedelta | float,
    *,
    workflow: str | None = None,
    status: RunStatus | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> PruneQuery:
    """The query of a prune of runs settled ``older_than`` before ``now_ms``."""
    return PruneQuery(
        cutoff_ms=now_ms - retention_ms(older_than),
        workflow=workflow,
        status=status,
        batch_size=batch_size,
    )


def prune_runs(
    store: RunPruning,
    query: PruneQuery,
    *,
    dry_run: bool = False,
    time_budget: float | None = None,
    on_batch: Callable[[PruneBatch], None] | None = None,
) -> PruneReport:
    """Batches until no root is left (or ``time_budget`` seconds are spent),
    each its own transaction; ``on_batch`` hears each (a progress bar)."""
    report = PruneReport(dry_run=dry_run)
    began = time.monotonic()
    while True:
        batch = store.prune_batch(query, dry_run=dry_run)
        if batch.exhausted:
            report.finished = True
            break
        report.batches += 1
        report.looked_at += batch.looked_at
        report.trees += batch.trees
        report.counts.add(batch.counts)
        report.max_held_ms = max(report.max_held_ms, batch.held_ms)
        if on_batch is not None:
            on_batch(batch)
        query = PruneQuery(
            cutoff_ms=query.cutoff_ms,
            workflow=query.workflow,
            status=query.status,
            batch_size=query.batch_size,
            after=batch.after,
        )
        if time_budget is not None and time.monotonic() - began >= time_budget:
            break
    report.seconds = time.monotonic() - began
    return report


def prune(
    engine: WorkflowEngine,
    older_than: timedelta | float,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    time_budget: float | None = TICK_SECONDS,
) -> PruneReport:
    """The beat's prune: under the prune lease (a prune already running
    elsewhere: ``skipped``), at most ``time_budget`` seconds of batches."""
    store = engine.store
    if not isinstance(store, RunPruning):
        log.warning("prune: the store %s cannot prune runs", type(store).__name__)
        return PruneReport(skipped=True)
    holder = f"{engine.worker_id}/{uuid.uuid4().hex[:12]}"
    report = PruneReport()
    try:
        with hold_lease(engine.leases, PRUNE_LEASE_KEY, PRUNE_LEASE_TTL, holder):
            query = prune_query(store, store.now_ms(), older_than, batch_size=batch_size)
            report = prune_runs(store, query, time_budget=time_budget)
    except LeaseTakenError:
        report.skipped = True
    except LeaseLostError as exc:  # the batches it ran are committed, each whole
        log.warning("prune: %s", exc)
    if report.counts.runs:
        log.info("prune: %s", report.as_dict())
    return report
