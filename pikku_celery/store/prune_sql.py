"""Pruning on SQL: one batch of whole settled run trees, one short transaction.

A batch reads candidate roots by the keyset cursor (no lock), locks those
still settled by the cutoff skipping any a worker holds, walks their children
level by level locking each the same way, and drops every tree with a run it
could not lock (not settled, settled too late, or held). What is left goes,
children first: attempts, steps, signals, audit rows, run leases, the runs'
idempotency keys, runs. Every
list of ids is sent in chunks, so no statement outgrows a driver's limit on
parameters however large the batch.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from ..sql.schema import lease_table
from .prune import RUN_LEASE_PREFIX, PruneBatch, PruneCounts, PruneQuery
from .statements_prune import prune_statements

CHUNK = 500
"""Ids per statement (SQLite's parameter limit is far above it)."""

MAX_TREE_DEPTH = 1000
"""Levels of children a batch walks at most (runs nest far less deep)."""


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), CHUNK):
        yield list(ids[i : i + CHUNK])


def _query_params(query: PruneQuery) -> dict[str, Any]:
    after_at, after_id = query.after if query.after is not None else (-1, "")
    return {
        "p_cutoff": query.cutoff_ms,
        "p_status": None if query.status is None else query.status.value,
        "p_workflow": query.workflow,
        "p_after_at": after_at,
        "p_after_id": after_id,
        "p_limit": query.batch_size,
    }


class SQLPruner:
    """Deletes settled run trees through a store's engine."""

    def __init__(self, engine: sa.Engine, isolation: str | None = None) -> None:
        self.engine = engine
        self.isolation = isolation
        self.statements = prune_statements()
        self._has_leases: bool | None = None

    def leases_here(self) -> bool:
        """Whether this database keeps pikku's leases (asked once)."""
        if self._has_leases is None:
            self._has_leases = sa.inspect(self.engine).has_table(lease_table.name)
        return self._has_leases

    def count(self, query: PruneQuery) -> int:
        """Roots the query's filters match."""
        stmt = self.statements.count_roots(query.status is not None, query.workflow is not None)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt, _query_params(query)).scalar_one())

    def batch(self, query: PruneQuery, dry_run: bool) -> PruneBatch:
        """One batch in one transaction (see the module's docstring)."""
        leases = self.leases_here()
        st = self.statements
        found = PruneBatch()
        candidates = st.candidates(query.status is not None, query.workflow is not None)
        with self._connect() as conn:
            began = time.perf_counter()
            with conn.begin():
                rows = conn.execute(candidates, _query_params(query)).all()
                found.looked_at = len(rows)
                if rows:
                    found.after = (int(rows[-1].updated_at), str(rows[-1].id))
                    runs = self._trees(conn, [str(r.id) for r in rows], query.cutoff_ms, found)
                    found.counts = self._delete(conn, runs, leases, dry_run)
            found.held_ms = (time.perf_counter() - began) * 1000  # BEGIN to COMMIT
        return found

    def _connect(self) -> sa.Connection:
        conn = self.engine.connect()
        if self.isolation is not None:
            conn = conn.execution_options(isolation_level=self.isolation)
        return conn

    def _locked(self, conn: sa.Connection, stmt: Any, ids: Sequence[str], cutoff: int) -> set[str]:
        got: set[str] = set()
        for chunk in _chunks(ids):
            got.update(r[0] for r in conn.execute(stmt, {"p_ids": chunk, "p_cutoff": cutoff}))
        return got

    def _trees(
        self, conn: sa.Connection, candidates: list[str], cutoff: int, found: PruneBatch
    ) -> list[str]:
        """Every run of the candidate trees it could lock whole, roots first."""
        st = self.statements
        roots = self._locked(conn, st.prune_lock_roots, candidates, cutoff)
        root_of = {r: r for r in roots}
        whole = set(roots)
        frontier = sorted(roots)
        for _ in range(MAX_TREE_DEPTH):
            if not frontier:
                break
            kids: list[tuple[str, str]] = []
            for chunk in _chunks(frontier):
                rows = conn.execute(st.prune_children, {"p_ids": chunk})
                kids += [(str(kid), str(parent)) for kid, parent in rows]
            locked = self._locked(conn, st.prune_lock_runs, [k for k, _ in kids], cutoff)
            frontier = []
            for kid, parent in kids:
                root = root_of[parent]
                if kid in root_of:  # a cycle: never made by pikku; leave the tree
                    whole.discard(root)
                    continue
                root_of[kid] = root
                if kid not in locked:
                    whole.discard(root)  # a child still going, or held: not now
                frontier.append(kid)
        else:
            whole.clear()  # deeper than any run nests: leave it all
        found.trees = len(whole)
        return [run for run, root in root_of.items() if root in whole]

    def _delete(
        self, conn: sa.Connection, runs: list[str], leases: bool, dry_run: bool
    ) -> PruneCounts:
        st = self.statements
        counts = PruneCounts(runs=len(runs))
        steps: list[str] = []
        for chunk in _chunks(runs):
            steps += [str(r[0]) for r in conn.execute(st.prune_step_ids, {"p_ids": chunk})]
        counts.steps = len(steps)
        keys = [RUN_LEASE_PREFIX + r for r in runs] if leases else []

        def each(delete: Any, count: Any, name: str, ids: list[str]) -> int:
            n = 0
            for chunk in _chunks(ids):
                params = {f"p_{name}": chunk}
                if dry_run:
                    n += int(conn.execute(count, params).scalar_one())
                else:
                    n += int(conn.execute(delete, params).rowcount)
            return n

        counts.attempts = each(st.prune_delete_attempts, st.prune_count_attempts, "step_ids", steps)
        counts.signals = each(st.prune_delete_signals, st.prune_count_signals, "ids", runs)
        counts.audit = each(st.prune_delete_audit, st.prune_count_audit, "ids", runs)
        counts.leases = each(st.prune_delete_leases, st.prune_count_leases, "keys", keys)
        if not dry_run:
            for chunk in _chunks(runs):
                conn.execute(st.prune_delete_steps, {"p_ids": chunk})
            self._delete_keys(conn, runs)
            deleted = 0
            for chunk in _chunks(runs):
                deleted += int(conn.execute(st.prune_delete_runs, {"p_ids": chunk}).rowcount)
            counts.runs = deleted
        return counts

    def _delete_keys(self, conn: sa.Connection, runs: list[str]) -> None:
        """The key rows that name these runs, by the key table's primary key."""
        st = self.statements
        for chunk in _chunks(runs):
            keyed = conn.execute(st.prune_keys["read"], {"p_ids": chunk}).all()
            if keyed:
                params = {
                    "p_ids": [r.id for r in keyed],
                    "p_workflows": sorted({r.workflow for r in keyed}),
                    "p_key_names": [r.idempotency_key for r in keyed],
                }
                conn.execute(st.prune_keys["delete"], params)
