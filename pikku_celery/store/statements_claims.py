"""The statements of a step's lease: the claim, renewal, fenced outcomes, expiry."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import AttemptStatus, StepKind, StepStatus
from .statements_terms import (
    CLAIM_TYPE,
    OUTCOMES,
    A,
    S,
    _claim_matches,
    _lapsed,
    _p,
    _status_in,
    fenced_pair,
    run_pinned,
)


class ClaimStatements:
    """Rules 1, 2, 3 and 5: claim, fenced outcome, fenced renewal, expiry."""

    def _claims(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Rule 1 (the claim) and rule 3 (fenced renewal)."""
        self._claim(now)
        self._renewal(now)

    def _claim(self, now: ColumnElement[int]) -> None:
        """Rule 1: the claim is one guarded write on the DB clock."""
        claimable = sa.or_(
            _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
            sa.and_(
                S.c.status == StepStatus.FAILED.value,
                S.c.attempt < S.c.max_attempts,
                S.c.wake_at.is_not(None),
                S.c.wake_at <= now,
            ),
            sa.and_(
                S.c.status == StepStatus.RUNNING.value,
                # its own expiry, never the claimer's lease length
                _lapsed(S, now, _p("bound_ms", sa.BigInteger())),
                S.c.attempt < S.c.max_attempts,
            ),
        )
        self.claim = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                # a message naming a step of another run is refused
                run_pinned(S),
                S.c.task_name == _p("task"),
                S.c.kind == StepKind.TASK.value,
                claimable,
            )
            .values(
                status=StepStatus.RUNNING.value,
                attempt=S.c.attempt + 1,
                lease_expires_at=now + _p("lease_ms", sa.BigInteger()),
                wake_at=sa.null(),
                worker=_p("worker"),
                result=sa.null(),
                error=sa.null(),
                updated_at=now,
                claim_id=_p("claim", CLAIM_TYPE),
            )
        )
        # A lapsed takeover leaves the previous attempt row 'running' (a failed
        # or expired attempt row is never 'running'): mark it superseded.
        self.supersede = (
            sa.update(A)
            .where(
                A.c.step_id == _p("id"),
                run_pinned(A),
                A.c.attempt == _p("attempt"),
                A.c.status == AttemptStatus.RUNNING.value,
            )
            .values(status=AttemptStatus.SUPERSEDED.value)
        )

    def _renewal(self, now: ColumnElement[int]) -> None:
        """Rule 3: renewal is fenced and never revives a lapsed lease."""
        renewable = (
            S.c.id == _p("id"),
            run_pinned(S),
            S.c.attempt == _p("attempt"),
            S.c.status == StepStatus.RUNNING.value,
            _claim_matches(),
            sa.or_(S.c.lease_expires_at.is_(None), S.c.lease_expires_at > now),
        )
        self.renewable = renewable
        self.renew = (
            sa.update(S)
            .where(*renewable)
            .values(lease_expires_at=now + _p("lease_ms", sa.BigInteger()), updated_at=now)
        )
        # The renewal counted on its attempt row (the run page's timeline).
        # Where one statement can write both rows (PostgreSQL, MySQL) the
        # dialect's renewal does; SQLite runs this after ``renew``, in its
        # transaction, with the time ``renew`` wrote (a second clock read
        # could fall in the next millisecond).
        self.renew_counted = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), run_pinned(A), A.c.attempt == _p("attempt"))
            .values(
                renewals=A.c.renewals + 1,
                renewed_at=sa.select(S.c.updated_at)
                .where(S.c.id == _p("id"), run_pinned(S))
                .scalar_subquery(),
            )
        )
        self.park = (
            sa.update(S).where(*renewable).values(lease_expires_at=sa.null(), updated_at=now)
        )

    def _outcomes(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Rule 2 (fenced outcomes) and rule 5 (a lapsed last attempt fails)."""
        # Rule 2: fenced outcomes, on the statement's clock (standalone) or on
        # the pass's 'now' (inside advance, so the view and the rows agree):
        # the step row's write, then its attempt row's.
        standalone = {kind: fenced_pair(kind, now) for kind in OUTCOMES}
        in_pass = {kind: fenced_pair(kind, at) for kind in OUTCOMES}
        self.fenced_step = {kind: pair[0] for kind, pair in standalone.items()}
        self.fenced_attempt = {kind: pair[1] for kind, pair in standalone.items()}
        self.fenced_at_step = {kind: pair[0] for kind, pair in in_pass.items()}
        self.fenced_at_attempt = {kind: pair[1] for kind, pair in in_pass.items()}

        # Rule 5: a lapsed last attempt fails for good.
        self.expire = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                run_pinned(S),
                S.c.attempt == _p("attempt"),
                S.c.status == StepStatus.RUNNING.value,
                _lapsed(S, now, _p("bound_ms", sa.BigInteger())),
                S.c.attempt >= S.c.max_attempts,
            )
            .values(
                status=StepStatus.FAILED.value,
                error=_p("error"),
                lease_expires_at=sa.null(),
                wake_at=sa.null(),
                updated_at=now,
            )
        )
        self.expire_attempt = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), run_pinned(A), A.c.attempt == _p("attempt"))
            .values(status=AttemptStatus.LEASE_EXPIRED.value, error=_p("error"), finished_at=now)
        )
        self.mark_scheduled = (
            sa.update(S)
            .where(
                S.c.id.in_(sa.bindparam("p_ids", expanding=True)),
                sa.or_(
                    _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
                    sa.and_(S.c.status == StepStatus.FAILED.value, S.c.wake_at.is_not(None)),
                ),
            )
            .values(
                status=sa.case(
                    (S.c.status == StepStatus.PENDING.value, StepStatus.SCHEDULED.value),
                    else_=S.c.status,
                ),
                scheduled_at=now,
            )
        )
