"""The statements MySQL/MariaDB run differently: two-table outcomes and batches.

MySQL has no ``UPDATE ... RETURNING``: an outcome writes the step and its
attempt row in one two-table ``UPDATE`` inside a pass, and a standalone claim
or outcome is a multi-statement batch with its COMMIT (one round trip; see
:mod:`.batch`).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import BROKER, AttemptStatus
from ..sql.engines import now_ms_expr
from .statements import Statements
from .statements_terms import (
    CLAIMED_ATTEMPT_COLUMNS,
    FENCE,
    OUTCOMES,
    A,
    R,
    S,
    _lit,
    _outcome_values,
    _p,
    claim_delivery,
    optimistic_run_values,
    run_pinned,
)

# The optimistic pass's gates, session variables set inside its batch.
PINNED: ColumnElement[int] = sa.literal_column("@pikku_pinned", sa.Integer())
FENCED: ColumnElement[int] = sa.literal_column("@pikku_fenced", sa.Integer())


class MySQLStatements(Statements):
    """The portable statements, and MySQL/MariaDB's batches."""

    def __init__(self) -> None:
        now = now_ms_expr("mysql")
        super().__init__(now)
        at = _p("now", sa.BigInteger())
        # A key already written: no row (it waits for that start's commit),
        # not an error (the loser reads the run in its own transaction).
        self.key_insert = self.key_insert.prefix_with("IGNORE")
        self.fenced_both = {kind: self._fenced_both(kind, now) for kind in OUTCOMES}
        self.fenced_both_at = {kind: self._fenced_both(kind, at) for kind in OUTCOMES}
        # A renewal and its count on the attempt row, one two-table UPDATE:
        # 2 rows matched if renewed.
        self.renew_both = (
            sa.update(S)
            .where(
                *self.renewable, A.c.step_id == S.c.id, run_pinned(A), A.c.attempt == S.c.attempt
            )
            .values(
                {
                    S.c.lease_expires_at: now + _p("lease_ms", sa.BigInteger()),
                    S.c.updated_at: now,
                    A.c.renewals: A.c.renewals + 1,
                    A.c.renewed_at: now,
                }
            )
        )

    @staticmethod
    def _fenced_both(kind: str, now: ColumnElement[int]) -> sa.Update:
        """Step and attempt row in one UPDATE: 2 rows matched if the fence held.
        UTC_TIMESTAMP() is fixed for the statement: both rows get one time."""
        step_values, attempt_values = _outcome_values(kind, now)
        return (
            sa.update(S)
            .where(*FENCE, A.c.step_id == S.c.id, run_pinned(A), A.c.attempt == S.c.attempt)
            .values(
                {S.c[k]: v for k, v in step_values.items()}
                | {A.c[k]: v for k, v in attempt_values.items()}
                | {A.c.finished_at: now}
            )
        )

    def pass_batch(
        self, kind: str | None, new_step: bool, ends: bool, eager: bool = False, values: int = 0
    ) -> list[sa.ClauseElement | str]:
        """A whole pass as ONE batch with its COMMIT (the optimistic hot path,
        as PostgreSQL's ``pass_write`` statement).

        A locking read pins the run row only if its version is still the one
        the pass read (lock order run, then step, as in the locked pass); the
        fenced outcome needs the pin; the run update needs the outcome; the
        new step (and, ``eager``, its attempt row) needs the run update. Every
        write is gated on the one before, so the COMMIT commits all of the
        pass or nothing of it. Answers (pinned, fenced) as 1 or 0. The store
        keeps the batch it compiles of each shape. ``values``: that many
        settled value steps (``ctx.set_event``) beside the new step
        (parameters ``v0_*``...), gated the same way.
        """
        at = _p("now", sa.BigInteger())
        pin = sa.text(
            f"SET @pikku_pinned := (SELECT COUNT(*) FROM {R.name} "
            "WHERE id = :p_run AND version = :p_version FOR UPDATE)"
        ).bindparams(sa.bindparam("p_run", type_=sa.String()), sa.bindparam("p_version"))
        batch: list[sa.ClauseElement | str] = [pin]
        gate = PINNED == 1
        if kind is not None:
            batch += [self.fenced_both_at[kind].where(gate), "SET @pikku_fenced := ROW_COUNT()"]
            gate = FENCED == 2
        run_values = optimistic_run_values(at, ends)
        batch.append(sa.update(R).where(R.c.id == _p("run"), gate).values(**run_values))
        batch += [_insert_if(S, f"v{i}_", gate) for i in range(values)]
        if new_step:
            batch.append(_insert_if(S, "n_", gate))
        if new_step and eager:
            batch.append(_insert_if(A, "a_", gate))
        fenced = "@pikku_fenced = 2" if kind is not None else "@pikku_pinned = 1"
        return [*batch, f"SELECT @pikku_pinned = 1 AS pinned, {fenced} AS fenced", "COMMIT"]

    def start_batch(self, values: int = 0) -> list[sa.ClauseElement | str]:
        """A new run (parameters ``r_*``) and its first step (``n_*``) with
        their COMMIT: ``start()`` in one round trip; ``values`` settled value
        steps (``ctx.set_event`` before the first step: ``v0_*``...) beside."""
        run = sa.insert(R).values({c.name: sa.bindparam(f"r_{c.name}", type_=c.type) for c in R.c})
        steps = [
            sa.insert(S).values({c.name: sa.bindparam(f"{p}{c.name}", type_=c.type) for c in S.c})
            for p in [*(f"v{i}_" for i in range(values)), "n_"]
        ]
        return [run, *steps, "COMMIT"]

    def claim_batch(self, inline_row_count: bool) -> list[sa.ClauseElement | str]:
        """The claim as one multi-statement batch (see :mod:`.batch`).

        The UPDATE's row count gates the rest: read inline with ``ROW_COUNT()``
        where the server evaluates it as the previous statement's count
        (MariaDB), else kept in a session variable first. One INSERT writes
        the new attempt's row and, on a lapsed takeover, marks the previous
        attempt's row superseded (it exists, so it lands in ON DUPLICATE KEY;
        a failed previous attempt keeps its status). The read back returns
        the row either way, with the verdict beside it, so a refused claim
        can still name a task-name mismatch.
        """
        row_count = sa.func.row_count()
        gate = row_count if inline_row_count else sa.literal_column("@pikku_claimed")
        back = sa.union_all(
            sa.select(sa.literal_column("0").label("d")),
            sa.select(sa.literal_column("1").label("d")),
        ).subquery("back")
        this_or_previous = (
            sa.select(
                S.c.id,
                S.c.attempt - back.c.d,
                S.c.run_id,
                sa.case(
                    (back.c.d == 0, _lit(AttemptStatus.RUNNING.value)),
                    else_=_lit(AttemptStatus.SUPERSEDED.value),
                ),
                S.c.worker,
                S.c.updated_at,
                S.c.claim_id,
                _lit(BROKER),
                # the claim's message and node on its own row; a superseded
                # row (ON DUPLICATE KEY) keeps its own
                *[sa.case((back.c.d == 0, p), else_=sa.null()) for p in claim_delivery()],
            )
            .select_from(S.join(back, sa.true()))
            .where(S.c.id == _p("id"), run_pinned(S), gate == 1, S.c.attempt - back.c.d >= 1)
        )
        attempt_rows = (
            mysql.insert(A)
            .from_select(
                CLAIMED_ATTEMPT_COLUMNS,
                this_or_previous,
            )
            .on_duplicate_key_update(
                status=sa.case(
                    (
                        A.c.status == _lit(AttemptStatus.RUNNING.value),
                        _lit(AttemptStatus.SUPERSEDED.value),
                    ),
                    else_=A.c.status,
                )
            )
        )
        # Inline, the read back sees the INSERT's count: rows only if claimed.
        claimed_here = (row_count > 0) if inline_row_count else (gate == 1)
        batch: list[sa.ClauseElement | str] = [self.claim]
        if not inline_row_count:
            batch.append("SET @pikku_claimed := ROW_COUNT()")
        # The read back as ONE JSON array (the step's columns, then the
        # verdict): the driver then parses one column description instead of
        # one per column, on every claim.
        packed = sa.func.json_array(*S.c, claimed_here)
        return [
            *batch,
            attempt_rows,
            sa.select(packed.label("packed")).where(S.c.id == _p("id"), run_pinned(S)),
            "COMMIT",
        ]

    def outcome_batch(self, kind: str, inline_row_count: bool) -> list[sa.ClauseElement | str]:
        """A standalone fenced outcome and its COMMIT as one batch.

        Two single-table UPDATEs (cheaper on InnoDB than the two-table one),
        the attempt row's gated on the step's row count (as in
        :meth:`claim_batch`): a superseded attempt's row never takes
        its result.
        """
        step, attempt = self.fenced_step[kind], self.fenced_attempt[kind]
        if inline_row_count:
            return [step, attempt.where(sa.func.row_count() == 1), "COMMIT"]
        return [
            step,
            "SET @pikku_fenced := ROW_COUNT()",
            attempt.where(sa.literal_column("@pikku_fenced") == 1),
            "COMMIT",
        ]


def _insert_if(table: sa.Table, prefix: str, gate: ColumnElement[bool]) -> sa.Insert:
    """One row of ``table`` from parameters ``<prefix><column>``, only if ``gate``."""
    cols = list(table.c)
    values = sa.select(*[sa.bindparam(f"{prefix}{c.name}", type_=c.type) for c in cols])
    return sa.insert(table).from_select([c.name for c in cols], values.where(gate))
