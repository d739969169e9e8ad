"""Every statement retention runs, each under a name (``prune_*`` in the registry).

Kept apart from the hot path's statements: none of these runs while a
workflow runs. Each is an index range or a primary-key lookup: candidate
roots are read by ``ix_pikku_run_settled_root`` (one range per settled
status, oldest first, after a keyset cursor; the statement repeats the
index's predicate so a bound status can use it), children by
``ix_pikku_run_parent``, steps by the ``(run_id, name)`` key, attempts by
their ``(step_id, attempt)`` key, audit rows by ``ix_pikku_audit_run``,
idempotency keys by their ``(workflow, idempotency_key)`` key (read from the
runs first: the key table has no index by run).
Rows about to be deleted are locked ``FOR UPDATE SKIP LOCKED`` (rendered
where the dialect has it; SQLite serialises writers with ``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import RunStatus
from ..sql.schema import (
    attempt_table,
    audit_table,
    lease_table,
    run_key_table,
    run_table,
    signal_table,
    step_table,
)

R, S, A, G, AU, L = run_table, step_table, attempt_table, signal_table, audit_table, lease_table
K = run_key_table
SETTLED = (RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value)
FILTERS = ("status", "workflow")


def _p(name: str, type_: sa.types.TypeEngine[Any] | None = None) -> sa.BindParameter[Any]:
    return sa.bindparam(f"p_{name}", type_=type_)


def _ids(name: str = "ids") -> sa.BindParameter[Any]:
    return sa.bindparam(f"p_{name}", expanding=True)


def _settled(t: sa.Table) -> ColumnElement[bool]:
    """Settled, as ORs (a constant IN list would be an expanding parameter)."""
    return sa.or_(*[t.c.status == s for s in SETTLED])


def _old_enough(t: sa.Table) -> ColumnElement[bool]:
    return t.c.updated_at <= _p("cutoff", sa.BigInteger())


class PruneStatements:
    """Retention's statements; :meth:`named` gives them to the registry."""

    def __init__(self) -> None:
        runs = _ids()
        # Lock what a batch deletes, skipping what a worker holds right now.
        self.prune_lock_roots = (
            sa.select(R.c.id)
            .where(R.c.id.in_(runs), R.c.parent_run_id.is_(None), _settled(R), _old_enough(R))
            .with_for_update(skip_locked=True)
        )
        self.prune_lock_runs = (
            sa.select(R.c.id)
            .where(R.c.id.in_(runs), _settled(R), _old_enough(R))
            .with_for_update(skip_locked=True)
        )
        self.prune_children = sa.select(R.c.id, R.c.parent_run_id).where(
            R.c.parent_run_id.in_(runs)
        )
        self.prune_step_ids = sa.select(S.c.id).where(S.c.run_id.in_(runs))
        steps = _ids("step_ids")
        keys = _ids("keys")
        self.prune_count_attempts = sa.select(sa.func.count()).where(A.c.step_id.in_(steps))
        self.prune_count_signals = sa.select(sa.func.count()).where(G.c.run_id.in_(runs))
        self.prune_count_audit = sa.select(sa.func.count()).where(AU.c.run_id.in_(runs))
        self.prune_count_leases = sa.select(sa.func.count()).where(L.c.key.in_(keys))
        # Children first: attempts and steps, then what else hangs off the run.
        self.prune_delete_attempts = sa.delete(A).where(A.c.step_id.in_(steps))
        self.prune_delete_steps = sa.delete(S).where(S.c.run_id.in_(runs))
        self.prune_delete_signals = sa.delete(G).where(G.c.run_id.in_(runs))
        self.prune_delete_audit = sa.delete(AU).where(AU.c.run_id.in_(runs))
        self.prune_delete_leases = sa.delete(L).where(L.c.key.in_(keys))
        # The runs' idempotency keys (a pruned key starts a new run): each
        # run's (workflow, key), then the key rows that still name these runs.
        self.prune_keys: dict[str, sa.Executable] = {
            "read": sa.select(R.c.id, R.c.workflow, R.c.idempotency_key).where(
                R.c.id.in_(runs), R.c.idempotency_key.is_not(None)
            ),
            "delete": sa.delete(K).where(
                K.c.workflow.in_(_ids("workflows")),
                K.c.idempotency_key.in_(_ids("key_names")),
                K.c.run_id.in_(runs),
            ),
        }
        # settled, again: the lock already holds it, this keeps it so if reused
        self.prune_delete_runs = sa.delete(R).where(R.c.id.in_(runs), _settled(R))

    def named(self) -> dict[str, sa.ClauseElement]:
        """Every statement by name, each filter shape of a family built here."""
        found: dict[str, sa.ClauseElement] = {
            name: value for name, value in vars(self).items() if isinstance(value, sa.ClauseElement)
        }
        found.update((f"prune_keys[{k}]", v) for k, v in self.prune_keys.items())  # type: ignore[misc]
        found.update(self._families())
        return found

    def _families(self) -> Iterator[tuple[str, sa.ClauseElement]]:
        for flags in itertools.product((False, True), repeat=2):
            shape = ",".join(f for f, on in zip(FILTERS, flags, strict=True) if on)
            yield f"prune_candidates[{shape}]", self.candidates(*flags)
            yield f"prune_count_roots[{shape}]", self.count_roots(*flags)

    @functools.lru_cache(maxsize=4)  # noqa: B019 - built once, kept for good
    def candidates(self, status: bool, workflow: bool) -> sa.Select[Any]:
        """Roots settled by the cutoff, oldest first after the cursor
        (``p_after_at``, ``p_after_id``), at most ``p_limit``: one index range
        per settled status (``p_status`` alone when filtered), merged."""
        limit = _p("limit", sa.Integer())
        after_at, after_id = _p("after_at", sa.BigInteger()), _p("after_id", sa.String(36))
        statuses = [_p("status")] if status else [sa.literal(s) for s in SETTLED]
        members = []
        for each in statuses:
            q = sa.select(R.c.id, R.c.updated_at).where(
                R.c.status == each,
                _old_enough(R),
                R.c.updated_at >= after_at,  # bounds the index range; the OR below is exact
                sa.or_(
                    R.c.updated_at > after_at,
                    sa.and_(R.c.updated_at == after_at, R.c.id > after_id),
                ),
                R.c.parent_run_id.is_(None),
                _settled(R),  # the partial index's predicate, for a bound p_status
            )
            if workflow:
                q = q.where(R.c.workflow == _p("workflow"))
            members.append(q.order_by(R.c.updated_at, R.c.id).limit(limit))
        if len(members) == 1:
            return members[0]
        union = sa.union_all(*[sa.select(m.subquery()) for m in members]).subquery("roots")
        return sa.select(union).order_by(union.c.updated_at, union.c.id).limit(limit)

    @functools.lru_cache(maxsize=4)  # noqa: B019 - built once, kept for good
    def count_roots(self, status: bool, workflow: bool) -> sa.Select[Any]:
        """How many roots a prune's filters match (its progress bar's total)."""
        q = sa.select(sa.func.count()).where(
            R.c.parent_run_id.is_(None),
            _old_enough(R),
            R.c.status == _p("status") if status else _settled(R),
        )
        if workflow:
            q = q.where(R.c.workflow == _p("workflow"))
        return q


@functools.cache
def prune_statements() -> PruneStatements:
    """The one set of retention statements (they use no dialect's clock)."""
    return PruneStatements()
