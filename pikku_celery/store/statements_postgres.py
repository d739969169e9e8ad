"""The statements PostgreSQL runs differently: one round trip for each hot operation.

A claim, a standalone outcome and a whole pass are each one data-modifying
CTE; a run's insert returns the database's timestamps; the optimistic pass
reads the run and its steps unlocked in one go; a settled run is announced
with ``pg_notify``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import BROKER, AttemptStatus
from ..sql.engines import now_ms_expr
from ..sql.schema import run_key_table as K
from ..sql.settle import SETTLED_CHANNEL
from .statements import Statements
from .statements_terms import (
    CLAIMED_ATTEMPT_COLUMNS,
    FENCE,
    OUTCOMES,
    A,
    G,
    R,
    S,
    _lit,
    _outcome_values,
    _p,
    claim_delivery,
    fenced_pair,
    optimistic_run_values,
    run_pinned,
)

# The most steps a claim reads for its pass (bigger runs' passes read).
CLAIM_VIEW_STEPS = 64
PASS_KINDS = (None, *OUTCOMES)


class PostgresStatements(Statements):
    """The portable statements, and PostgreSQL's one-round-trip forms."""

    def __init__(self) -> None:
        now = now_ms_expr("postgresql")
        super().__init__(now)
        at = _p("now", sa.BigInteger())
        stamped = ("created_at", "updated_at")  # the database clock
        # A key already written: no row back (it waits for that start's
        # commit), not an error that would end the transaction.
        self.key_insert = (
            postgresql.insert(K)
            .values(
                workflow=_p("workflow"),
                idempotency_key=_p("key"),
                run_id=_p("id"),
                created_at=now,
            )
            .on_conflict_do_nothing(index_elements=[K.c.workflow, K.c.idempotency_key])
            .returning(K.c.run_id)
        )
        self.run_insert_returning = (
            # both columns back: each reads the clock, and the two reads
            # may fall in different milliseconds. Every other column is an
            # explicit parameter: the statement compiles whole, once, for
            # the libpq runner too.
            sa.insert(R)
            .values(
                {
                    **{c.name: sa.bindparam(c.name, type_=c.type) for c in R.c},
                    **dict.fromkeys(stamped, now),
                }
            )
            .returning(R.c.created_at, R.c.updated_at)
        )
        # A new run and its first pass's one step, as one statement (start()).
        started = (
            sa.insert(R)
            .values({c.name: sa.bindparam(f"r_{c.name}", type_=c.type) for c in R.c})
            .returning(R.c.id)
            .cte("started")
        )
        self.run_start = (
            sa.insert(S)
            .from_select(
                [c.name for c in S.c],
                sa.select(*[sa.bindparam(f"n_{c.name}", type_=c.type) for c in S.c]).where(
                    sa.exists(sa.select(started.c.id))
                ),
            )
            .returning(S.c.id)
            .add_cte(started)
        )
        self.notify_settled = sa.select(
            sa.func.pg_notify(
                sa.bindparam("channel", type_=sa.String()),
                sa.bindparam("notice", type_=sa.String()),
            )
        )
        # A claim from a message commits without waiting for the WAL flush
        # (synchronous_commit off for that one statement's transaction): a
        # crash that loses it reverts the step, and the claim id fences out
        # the lost claim's body. claim_view_durable waits, for
        # Pikku(durable_claims=True).
        asynchronous = self.claim.where(
            sa.literal_column("set_config('synchronous_commit', 'off', true)").is_not(None)
        )
        self.claim_view = self._claim_view(now, asynchronous)
        self.claim_view_durable = self._claim_view(now, self.claim)
        # Standalone and in-pass outcomes: the step and its attempt row in one
        # statement, returning 1 if the fence held, else 0.
        self.fenced_cte = {kind: self._fenced_cte(kind, now) for kind in OUTCOMES}
        self.fenced_cte_at = {kind: self._fenced_cte(kind, at) for kind in OUTCOMES}
        # A renewal and its count on the attempt row, one statement: 1 if renewed.
        renewed = self.renew.returning(S.c.id, S.c.attempt, S.c.updated_at).cte("renewed")
        counted = (
            sa.update(A)
            .where(*_attempt_of(renewed))
            .values(renewals=A.c.renewals + 1, renewed_at=renewed.c.updated_at)
            .cte("counted")
        )
        self.renew_counted_cte = sa.select(sa.func.count()).select_from(renewed).add_cte(counted)

    def _families(self) -> Iterator[tuple[str, sa.ClauseElement]]:
        for kind, new_step, ends in itertools.product(PASS_KINDS, (False, True), (False, True)):
            shape = f"{kind or 'first'}{',step' if new_step else ''}{',ends' if ends else ''}"
            yield f"pass_write[{shape}]", self.pass_write(kind, new_step, ends)
            if new_step and not ends:
                yield f"pass_write[{shape},eager]", self.pass_write(kind, new_step, ends, True)
                # A step beside an event (ctx.set_event): the value step rides along.
                yield (
                    f"pass_write[{shape},eager,value]",
                    self.pass_write(kind, new_step, ends, True, 1),
                )

    def _claim_view(self, now: ColumnElement[int], claim: sa.Update) -> sa.Select[Any]:
        """The claim as one statement: the guarded update, the new attempt
        row, the superseded mark of a lapsed attempt's row, and what the
        step's pass will need (the run and its recorded steps, as of before
        the claim; the claimed step's new state in the ``c_`` columns). The
        pass then skips its own read; its version check still guards against
        anything that happened in between."""
        claimed = claim.returning(*S.c).cte("claimed")
        superseded = (
            sa.update(A)
            .where(
                # parameters, not claimed's columns: a primary key seek
                A.c.step_id == _p("id"),
                run_pinned(A),
                A.c.attempt == claimed.c.attempt - 1,
                A.c.status == AttemptStatus.RUNNING.value,
            )
            .values(status=AttemptStatus.SUPERSEDED.value)
            .cte("superseded")
        )
        recorded = (
            sa.insert(A)
            .from_select(
                CLAIMED_ATTEMPT_COLUMNS,
                sa.select(
                    claimed.c.id,
                    claimed.c.attempt,
                    claimed.c.run_id,
                    _lit(AttemptStatus.RUNNING.value),
                    claimed.c.worker,
                    claimed.c.updated_at,
                    claimed.c.claim_id,
                    _lit(BROKER),
                    *claim_delivery(),
                ),
            )
            .cte("recorded")
        )
        # The run's input (up to max_input_bytes, never changed) is not sent
        # again to the claimer that knows the run at this version.
        known = _p("known", sa.BigInteger())
        claim_head = (
            sa.select(
                *[
                    sa.case((R.c.version == known, sa.null()), else_=c).label("r_input")
                    if c.name == "input"
                    else c.label(f"r_{c.name}")
                    for c in R.c
                ],
                now.label("db_now"),
                sa.exists().where(G.c.run_id == R.c.id).label("has_signals"),
            )
            .where(R.c.id == claimed.c.run_id)
            .subquery("claim_head")
        )
        # At most CLAIM_VIEW_STEPS + 1 steps: a bigger run's claim does not
        # carry it whole (its pass reads it itself), and none when the step's
        # own position shows the run is bigger, or when the claimer already
        # knows the run at this version (it wrote the last pass).
        recorded_steps = (
            sa.select(S)
            .where(
                S.c.run_id == claim_head.c.r_id,
                claimed.c.seq < CLAIM_VIEW_STEPS,
                claim_head.c.r_version != known,
            )
            .order_by(S.c.seq)
            .limit(CLAIM_VIEW_STEPS + 1)
            .lateral("recorded_steps")
        )
        return (
            sa.select(
                *[c.label(f"c_{c.name}") for c in claimed.c],
                claim_head,
                recorded_steps,
            )
            .select_from(claimed.join(claim_head, sa.true()).outerjoin(recorded_steps, sa.true()))
            .order_by(recorded_steps.c.seq)
            .add_cte(superseded, recorded)
        )

    @functools.lru_cache(maxsize=8)  # noqa: B019 - built once per store class, kept for good
    def run_start_with(self, values: int) -> sa.Insert:
        """``run_start`` with ``values`` settled value steps (``ctx.set_event``
        before the first step; parameters ``v0_*``...) written beside it."""
        if values == 0:
            return self.run_start
        run = (
            sa.insert(R)
            .values({c.name: sa.bindparam(f"r_{c.name}", type_=c.type) for c in R.c})
            .returning(R.c.id)
            .cte("started")
        )

        def row(prefix: str) -> sa.Select[Any]:
            params = [sa.bindparam(f"{prefix}{c.name}", type_=c.type) for c in S.c]
            return sa.select(*params).where(sa.exists(sa.select(run.c.id)))

        names = [c.name for c in S.c]
        gated = [
            sa.insert(S).from_select(names, row(f"v{i}_")).cte(f"value_{i}") for i in range(values)
        ]
        return sa.insert(S).from_select(names, row("n_")).returning(S.c.id).add_cte(run, *gated)

    @staticmethod
    def _fenced_cte(kind: str, now: ColumnElement[int]) -> sa.Select[Any]:
        step, _ = fenced_pair(kind, now)
        _, attempt_values = _outcome_values(kind, now)
        done = step.returning(S.c.id, S.c.attempt, S.c.updated_at).cte("done")
        recorded = (
            sa.update(A)
            .where(*_attempt_of(done))
            .values(**attempt_values, finished_at=done.c.updated_at)
            .cte("recorded")
        )
        return sa.select(sa.func.count()).select_from(done).add_cte(recorded)

    @functools.lru_cache(maxsize=64)  # noqa: B019 - built once per store class, kept for good
    def pass_write(
        self, kind: str | None, new_step: bool, ends: bool, eager: bool = False, values: int = 0
    ) -> sa.Select[Any]:
        """A whole pass as ONE statement (the optimistic hot path).

        ``pinned`` locks the run row only if its version is still the one the
        pass read (so lock order is run, then step, as in the locked pass);
        the fenced outcome needs ``pinned``; the run update needs the
        outcome; the new step needs the run update. Returns (pinned, fenced):
        (0, 0) the version moved and nothing was written; (1, 0) the outcome
        was superseded and nothing was written; (1, 1) the pass landed.
        ``kind`` None: a pass without an outcome (a new run's first pass).
        ``eager``: the new step is written claimed, with its attempt row
        (parameters ``a_*``), for the worker that passes. ``values``: that
        many settled value steps (``ctx.set_event``) beside it (``v0_*``...).
        A pass that ends the run also sends its settle NOTIFY (delivered at
        commit, so only if it landed): no statement of its own for it.
        """
        at = _p("now", sa.BigInteger())
        pinned = (
            sa.select(R.c.id)
            .where(R.c.id == _p("run"), R.c.version == _p("version", sa.BigInteger()))
            .with_for_update()
            .cte("pinned")
        )
        outcome, ctes = _pass_outcome(kind, pinned, at)
        passed = (
            sa.update(R)
            .where(R.c.id == _p("run"), sa.exists(sa.select(outcome.c.id)))
            .values(**optimistic_run_values(at, ends))
            .returning(R.c.id)
            .cte("passed")
        )
        ctes.append(passed)
        if new_step:
            ctes.append(_gated_insert(S, "n_", passed, "recorded"))
        ctes += [_gated_insert(S, f"v{i}_", passed, f"value_{i}") for i in range(values)]
        if new_step and eager:
            ctes.append(_gated_insert(A, "a_", passed, "eager_attempt"))
        return sa.select(*_pass_counts(pinned, outcome, passed, ends)).add_cte(*ctes)


def _attempt_of(written: Any) -> list[ColumnElement[bool]]:
    """The attempt row of the step a CTE just wrote: its id bound to the
    parameter too, so the attempt's primary key is sought by a constant
    (joined only through the CTE, the planner may scan the run's attempts
    for the one row)."""
    return [
        A.c.step_id == _p("id"),
        A.c.step_id == written.c.id,
        run_pinned(A),
        A.c.attempt == written.c.attempt,
    ]


def _pass_outcome(kind: str | None, pinned: Any, at: ColumnElement[int]) -> tuple[Any, list[Any]]:
    """The one-statement pass's fenced outcome (gated on ``pinned``) and the
    CTEs that write it; with no outcome, ``pinned`` gates what follows."""
    if kind is None:
        return pinned, []
    step_values, attempt_values = _outcome_values(kind, at)
    outcome = (
        sa.update(S)
        .where(*FENCE, sa.exists(sa.select(pinned.c.id)))
        .values(**step_values)
        .returning(S.c.id, S.c.attempt)
        .cte("outcome")
    )
    recorded = (
        sa.update(A)
        .where(*_attempt_of(outcome))
        .values(**attempt_values, finished_at=at)
        .cte("outcome_attempt")
    )
    return outcome, [recorded]


def _gated_insert(table: sa.Table, prefix: str, passed: Any, name: str) -> Any:
    """A row of ``table`` from parameters ``<prefix><column>``, written only
    if the pass's run update (``passed``) landed."""
    cols = list(table.c)
    row = sa.select(*[sa.bindparam(f"{prefix}{c.name}", type_=c.type) for c in cols])
    return (
        sa.insert(table)
        .from_select([c.name for c in cols], row.where(sa.exists(sa.select(passed.c.id))))
        .cte(name)
    )


def _pass_counts(pinned: Any, outcome: Any, passed: Any, ends: bool) -> list[Any]:
    """What the one-statement pass returns: (pinned, fenced), and when it
    ``ends`` the run, the settle NOTIFY's count."""
    counts = [
        sa.select(sa.func.count()).select_from(pinned).scalar_subquery().label("pinned"),
        sa.select(sa.func.count()).select_from(outcome).scalar_subquery().label("fenced"),
    ]
    if ends:
        # A SELECT in a WITH runs only if read: the count reads it.
        notify = sa.func.pg_notify(sa.literal(SETTLED_CHANNEL), _p("notice"))
        notified = sa.select(notify.label("sent")).select_from(passed).cte("notified")
        sent = sa.select(sa.func.count()).select_from(notified).scalar_subquery()
        counts.append(sent.label("notified"))
    return counts
