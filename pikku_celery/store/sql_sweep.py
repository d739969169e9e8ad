"""The SQL store's sweep queries and retention, each indexed and bounded."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import ClassVar

from ..model.values import (
    RunState,
    StepState,
)
from .prune import PruneBatch, PruneQuery
from .prune_sql import SQLPruner
from .rows import (
    run_from,
    step_from,
)
from .sql_base import SQLBase, _prepared

IDLE_WINDOWS = 10
"""Windows of idle candidates one ``idle_runs`` call reads at most (busy ones
are set aside as it goes; the next sweep goes on)."""


class SQLSweep(SQLBase):
    """What the beat sweep and the pruner ask of the store."""

    prune_isolation: ClassVar[str | None] = None
    """The isolation level of a prune's batches (None: the engine's)."""

    # --- sweep ---------------------------------------------------------------
    @_prepared
    def lapsed_steps(self, limit: int, bound_ms: int | None = None) -> list[StepState]:
        params = {"p_limit": limit, "p_bound_ms": bound_ms}
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.lapsed, params)]

    @_prepared
    def undispatched_steps(self, older_than_ms: int, limit: int) -> list[StepState]:
        params = {"p_older_ms": older_than_ms, "p_limit": limit}
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.undispatched, params)]

    @_prepared
    def due_steps(self, limit: int) -> list[StepState]:
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.due, {"p_limit": limit})]

    @_prepared
    def idle_runs(self, idle_ms: int, limit: int) -> list[RunState]:
        # A window of candidates at a time; the busy ones are set aside for
        # idle_ms (out of the index ranges the next window reads), so busy
        # runs never fill every window and each is read once per idle period.
        st = self.statements
        params = {"p_idle_ms": idle_ms, "p_limit": limit}
        for _ in range(IDLE_WINDOWS):
            with self._one() as conn:
                rows = conn.execute(st.idle, params).all()
                busy = [r.id for r in rows if r.busy]
                if busy:
                    conn.execute(st.note_busy, {"p_ids": busy, "p_idle_ms": idle_ms})
            idle = [run_from(r) for r in rows if not r.busy]
            if idle or len(rows) < limit:
                return idle
        return []

    @_prepared
    def overdue_runs(self, limit: int) -> list[RunState]:
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(self.statements.overdue, {"p_limit": limit})]

    @_prepared
    def mark_blocked(self, run_id: str, reason: str) -> None:
        with self._one() as conn:
            conn.execute(self.statements.mark_blocked, {"p_id": run_id, "p_reason": reason})

    @_prepared
    def waiting_by_queue(self, older_than_ms: int) -> list[tuple[str | None, int, int]]:
        with self._one() as conn:
            rows = conn.execute(self.statements.waiting_by_queue, {"p_older_ms": older_than_ms})
            return [(r.queue, int(r.steps), int(r.oldest_ms)) for r in rows]

    @_prepared
    def note_swept(self, run_id: str, backoff_ms: int, max_backoff_ms: int | None = None) -> bool:
        params = {
            "p_id": run_id,
            "p_backoff_ms": backoff_ms,
            "p_max_backoff_ms": backoff_ms if max_backoff_ms is None else max_backoff_ms,
        }
        with self._one() as conn:
            return conn.execute(self.statements.note_swept, params).rowcount == 1

    @_prepared
    def note_steps_swept(
        self, step_ids: Sequence[str], backoff_ms: int, max_backoff_ms: int | None = None
    ) -> None:
        if not step_ids:
            return
        params = {
            "p_ids": list(step_ids),
            "p_backoff_ms": backoff_ms,
            "p_max_backoff_ms": backoff_ms if max_backoff_ms is None else max_backoff_ms,
        }
        with self._one() as conn:
            conn.execute(self.statements.note_steps_swept, params)

    # --- retention (see .prune and .prune_sql) --------------------------------
    @functools.cached_property
    def _pruner(self) -> SQLPruner:
        return SQLPruner(self._engine, self.prune_isolation)

    @_prepared
    def prune_batch(self, query: PruneQuery, *, dry_run: bool = False) -> PruneBatch:
        """Delete up to ``query.batch_size`` settled run trees in one transaction."""
        return self._pruner.batch(query, dry_run)

    @_prepared
    def count_prunable(self, query: PruneQuery) -> int:
        """How many roots the query's filters match."""
        return self._pruner.count(query)
