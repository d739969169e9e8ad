"""The sweep's statements: its bookkeeping, and its queries, each an index range scan."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import RunStatus, StepKind, StepStatus
from .statements_terms import (
    R,
    S,
    _lapsed,
    _not_terminal,
    _p,
    _status_in,
    _sweep_backoff,
    _union_oldest,
    _unsettled,
)


def _fresh() -> ColumnElement[bool]:
    """A step never re-sent by the sweep: found by its own time."""
    return S.c.next_sweep_at == 0


def _backed_off(now: ColumnElement[int]) -> ColumnElement[bool]:
    """A step re-sent, its backoff over: found by its backoff's end, behind the rest."""
    return sa.and_(S.c.next_sweep_at > 0, S.c.next_sweep_at <= now)


class SweepStatements:
    """What the sweep reads and notes."""

    def _sweep(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """The sweep's bookkeeping and its queries: each an index range scan."""
        self._sweep_notes(now)
        # 'now' as an uncorrelated scalar subquery: PostgreSQL's clock_timestamp()
        # is volatile, so compared directly it could only filter rows, never
        # bound an index range; a subquery is evaluated once (an InitPlan) and
        # its value can.
        once = sa.select(now).scalar_subquery()
        self._lapsed_steps(once)
        self._undispatched_steps(once)
        self._due_steps(once)
        self._idle_runs(once)

    def _sweep_notes(self, now: ColumnElement[int]) -> None:
        """The sweep's backoff, noted on the runs and steps it acted on."""
        not_terminal = _not_terminal(R)
        self.note_swept = (
            sa.update(R)
            .where(
                R.c.id == _p("id"),
                not_terminal,
                sa.or_(R.c.next_sweep_at.is_(None), R.c.next_sweep_at <= now),
            )
            .values(
                next_sweep_at=now + _sweep_backoff(R.c.sweep_count), sweep_count=R.c.sweep_count + 1
            )
        )
        # the per-step backoff, written on every step a sweep read (and acted on):
        # it leaves the sweep's ranges until then, and comes back behind the rest
        self.note_steps_swept = (
            sa.update(S)
            .where(S.c.id.in_(sa.bindparam("p_ids", expanding=True)))
            .values(
                next_sweep_at=now + _sweep_backoff(S.c.sweep_count), sweep_count=S.c.sweep_count + 1
            )
        )

    def _lapsed_steps(self, now: ColumnElement[int]) -> None:
        """Running steps whose lease lapsed: each an index range, oldest first."""
        running = S.c.status == StepStatus.RUNNING.value
        fresh, backed_off = _fresh(), _backed_off(now)
        # Two ranges of one index: leases that lapsed, and leases set further
        # ahead than any queue grants (an edited row, a clock gone wrong),
        # which count as lapsed at that bound. A NULL bound finds none.
        self.lapsed = _union_oldest(
            [
                sa.select(S)
                .where(
                    running, fresh, S.c.lease_expires_at.is_not(None), S.c.lease_expires_at <= now
                )
                .order_by(S.c.lease_expires_at),
                sa.select(S)
                .where(running, fresh, S.c.lease_expires_at > now + _p("bound_ms", sa.BigInteger()))
                .order_by(S.c.lease_expires_at.desc()),
                sa.select(S)
                .where(running, backed_off, _lapsed(S, now, _p("bound_ms", sa.BigInteger())))
                .order_by(S.c.next_sweep_at),
            ],
            lambda c: sa.func.coalesce(sa.func.nullif(c.next_sweep_at, 0), c.lease_expires_at),
        )

    def _undispatched_steps(self, now: ColumnElement[int]) -> None:
        """Task steps whose message was not sent (or not taken) for ``p_older_ms``,
        and how many wait per queue."""
        fresh, backed_off = _fresh(), _backed_off(now)
        cutoff = now - _p("older_ms", sa.BigInteger())
        undispatched: list[sa.Select[Any]] = []
        for status in (StepStatus.SCHEDULED.value, StepStatus.PENDING.value):
            task = (S.c.status == status, S.c.kind == StepKind.TASK.value)
            undispatched.append(
                sa.select(S)
                .where(*task, fresh, S.c.scheduled_at <= cutoff)
                .order_by(S.c.scheduled_at)
            )
            undispatched.append(
                sa.select(S)
                .where(*task, fresh, S.c.scheduled_at.is_(None), S.c.created_at <= cutoff)
                .order_by(S.c.created_at)
            )
            undispatched.append(
                sa.select(S)
                .where(
                    *task,
                    backed_off,
                    sa.func.coalesce(S.c.scheduled_at, S.c.created_at) <= cutoff,
                )
                .order_by(S.c.next_sweep_at)
            )
        self.undispatched = _union_oldest(
            undispatched,
            lambda c: sa.func.coalesce(
                sa.func.nullif(c.next_sweep_at, 0), c.scheduled_at, c.created_at
            ),
        )
        sent_at = sa.func.coalesce(S.c.scheduled_at, S.c.created_at)
        self.waiting_by_queue = (
            sa.select(
                S.c.queue,
                sa.func.count().label("steps"),
                (now - sa.func.min(sent_at)).label("oldest_ms"),
            )
            .where(
                _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
                S.c.kind == StepKind.TASK.value,
                sent_at <= cutoff,
            )
            .group_by(S.c.queue)
            .order_by(sa.func.count().desc(), sa.func.min(sent_at))
        )

    def _due_steps(self, now: ColumnElement[int]) -> None:
        """Steps whose wake-up is due (a timer, a retry's backoff)."""
        fresh, backed_off = _fresh(), _backed_off(now)
        due = (S.c.wake_at.is_not(None), S.c.wake_at <= now)
        self.due = _union_oldest(
            [
                member
                for status in (StepStatus.SCHEDULED.value, StepStatus.FAILED.value)
                for member in (
                    sa.select(S).where(S.c.status == status, fresh, *due).order_by(S.c.wake_at),
                    sa.select(S)
                    .where(S.c.status == status, backed_off, *due)
                    .order_by(S.c.next_sweep_at),
                )
            ],
            lambda c: sa.func.coalesce(sa.func.nullif(c.next_sweep_at, 0), c.wake_at),
        )

    def _idle_runs(self, now: ColumnElement[int]) -> None:
        """Runs with no pass for ``p_idle_ms``, and runs past their deadline."""
        # Idle runs: running, no pass for p_idle_ms, no step in flight. Two
        # ranges of the live-run index: runs never looked at since their last
        # pass (next_sweep_at NULL), by their last pass, and runs whose look
        # is due again (next_sweep_at <= now), by it. Each candidate says
        # whether it is busy (a step in flight); the store sets a busy one
        # aside for p_idle_ms (note_busy), so a window of busy runs is read
        # once per idle period, not on every sweep: the read is the window's
        # cost, not the live runs' number.
        running = R.c.status == RunStatus.RUNNING.value
        stale = R.c.updated_at <= now - _p("idle_ms", sa.BigInteger())
        candidates = _union_oldest(
            [
                sa.select(R)
                .where(running, R.c.next_sweep_at.is_(None), stale)
                .order_by(R.c.updated_at),
                sa.select(R)
                .where(running, R.c.next_sweep_at <= now, stale)
                .order_by(R.c.next_sweep_at),
            ],
            lambda c: sa.func.coalesce(c.next_sweep_at, c.updated_at),
        ).subquery("candidates")
        in_flight = sa.exists().where(S.c.run_id == candidates.c.id, _unsettled(S))
        self.idle = sa.select(candidates, in_flight.label("busy")).order_by(
            sa.func.coalesce(candidates.c.next_sweep_at, candidates.c.updated_at)
        )
        self.note_busy = (
            sa.update(R)
            .where(
                R.c.id.in_(sa.bindparam("p_ids", expanding=True)),
                running,
                sa.or_(R.c.next_sweep_at.is_(None), R.c.next_sweep_at <= now),
            )
            .values(next_sweep_at=now + _p("idle_ms", sa.BigInteger()))
        )
        # runs past their deadline (start(timeout=)), out of their sweep backoff
        self.overdue = (
            sa.select(R)
            .where(
                R.c.status == RunStatus.RUNNING.value,
                R.c.deadline_at <= now,
                sa.or_(R.c.next_sweep_at.is_(None), R.c.next_sweep_at <= now),
            )
            .order_by(R.c.deadline_at)
            .limit(_p("limit", sa.Integer()))
        )
