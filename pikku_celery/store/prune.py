"""The pruning port: settled run trees leave the store, a bounded batch at a time.

Retention deletes what nobody can touch any more: a run tree (a run started by
``start()`` and every child under it) whose runs are all settled and settled
before a cutoff. A batch is one short transaction; the rows it deletes are
locked without waiting (``FOR UPDATE SKIP LOCKED`` where the database has
it), so a worker writing a run is never blocked by a prune, and a run a worker
holds is left for the next batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..model.values import RunStatus

RUN_LEASE_PREFIX = "workflow-run:"
"""The key prefix of a run's orchestration lease (``workflow-run:<run id>``):
a pruned run's lease row goes with it where the store's database keeps leases."""


@dataclass(frozen=True)
class PruneQuery:
    """Which run trees a prune takes: roots settled at or before ``cutoff_ms``
    (epoch ms, the store's clock), of ``workflow`` and ``status`` when given.

    ``after`` is the keyset cursor a batch hands to the next one (the last
    root it looked at: ``(settled_at, run id)``), so trees left alone (a child
    still running, a row a worker holds) are passed over rather than read
    again by every batch.
    """

    cutoff_ms: int
    workflow: str | None = None
    status: RunStatus | None = None
    batch_size: int = 500
    after: tuple[int, str] | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size!r}")
        if self.status is not None and not RunStatus(self.status).terminal:
            raise ValueError(f"only settled runs are pruned; {self.status!r} is not settled")


@dataclass
class PruneCounts:
    """Rows one prune deleted (or, in a dry run, would delete), by kind."""

    runs: int = 0
    steps: int = 0
    attempts: int = 0
    signals: int = 0
    audit: int = 0
    leases: int = 0

    def add(self, other: PruneCounts) -> None:
        """Add another batch's counts to these."""
        for name in ("runs", "steps", "attempts", "signals", "audit", "leases"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class PruneBatch:
    """What one batch did: its counts, the roots it looked at and took, the
    cursor for the next batch, and how long it held its locks (ms: from its
    first locking statement to its commit)."""

    counts: PruneCounts = field(default_factory=PruneCounts)
    looked_at: int = 0
    trees: int = 0
    after: tuple[int, str] | None = None
    held_ms: float = 0.0

    @property
    def exhausted(self) -> bool:
        """No root was left to look at: the prune is done."""
        return self.looked_at == 0


@runtime_checkable
class RunPruning(Protocol):
    """A store that can delete settled run trees (every store pikku ships)."""

    def prune_batch(self, query: PruneQuery, *, dry_run: bool = False) -> PruneBatch:
        """Delete up to ``query.batch_size`` whole settled run trees in one
        transaction: the runs, their steps, attempts, signals, audit rows and
        run leases. Never a tree with a run not settled, or settled after the
        cutoff, or a row another transaction holds (left for a later batch).
        ``dry_run`` counts what it would delete and deletes nothing."""
        ...

    def count_prunable(self, query: PruneQuery) -> int:
        """How many roots the query's filters match (the progress bar's total;
        a tree with a run still going is counted but not pruned)."""
        ...
