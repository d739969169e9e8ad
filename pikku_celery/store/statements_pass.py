"""The statements of a pass: what it reads, and what it writes on its 'now'."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import StepStatus
from .statements_terms import (
    A,
    G,
    R,
    S,
    _not_terminal,
    _p,
    _run_pass_values,
    _settled,
    run_pinned,
)


class PassStatements:
    """A pass's read (optimistic) and its writes."""

    def _pass_view(self, now: ColumnElement[int]) -> None:
        """The optimistic pass's read (:mod:`.sql_optimistic`): the run, its
        clock, whether it has signals and its steps, unlocked, in one go."""
        run_head = (
            sa.select(
                *[c.label(f"r_{c.name}") for c in R.c],
                now.label("db_now"),
                sa.exists().where(G.c.run_id == R.c.id).label("has_signals"),
            )
            .where(R.c.id == _p("id"))
            .subquery("head")
        )
        self.pass_view = (
            sa.select(run_head, S)
            .select_from(run_head.outerjoin(S, S.c.run_id == run_head.c.r_id))
            .order_by(S.c.seq)
        )

    def _pass_writes(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """What a pass writes, on its 'now'."""
        not_terminal = _not_terminal(R)
        self.resolve = (
            sa.update(S)
            .where(S.c.id == _p("id"), run_pinned(S), sa.not_(_settled(S)))
            .values(
                status=_p("status"),
                result=_p("result"),
                error=_p("error"),
                lease_expires_at=sa.null(),
                wake_at=sa.null(),
                updated_at=at,
            )
        )
        self.resolve_attempt = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), run_pinned(A), A.c.attempt == _p("attempt"))
            .values(status=_p("status"), result=_p("result"), error=_p("error"), finished_at=at)
        )
        self.redispatch = (
            sa.update(S)
            .where(S.c.id.in_(sa.bindparam("p_ids", expanding=True)))
            .values(scheduled_at=at)
        )
        self.cancel_child = (
            sa.update(R)
            .where(R.c.id == _p("id"), not_terminal, R.c.cancel_requested == sa.false())
            .values(cancel_requested=True, version=R.c.version + 1, updated_at=at)
        )
        pass_values = _run_pass_values(at)
        self.run_pass = sa.update(R).where(R.c.id == _p("id")).values(**pass_values)
        self.run_end = (
            sa.update(R)
            .where(R.c.id == _p("id"))
            .values(
                **{**pass_values, "wake_at": sa.null()},
                status=_p("status"),
                output=_p("output"),
                error=_p("error"),
            )
        )
        self.settle_parent_step = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                S.c.run_id == _p("parent"),
                S.c.status == StepStatus.RUNNING.value,
                S.c.child_run_id == _p("child"),
            )
            .values(
                status=_p("status"),
                result=_p("result"),
                error=_p("error"),
                wake_at=sa.null(),
                updated_at=at,
            )
        )
        current_attempt = (
            sa.select(S.c.attempt)
            .where(S.c.id == _p("id"), S.c.run_id == _p("parent"))
            .scalar_subquery()
        )
        self.settle_parent_attempt = (
            sa.update(A)
            .where(
                A.c.step_id == _p("id"), A.c.run_id == _p("parent"), A.c.attempt == current_attempt
            )
            .values(status=_p("status"), result=_p("result"), error=_p("error"), finished_at=at)
        )
        self.touch_parent = (
            sa.update(R)
            .where(R.c.id == _p("id"), not_terminal)
            .values(version=R.c.version + 1, updated_at=at)
        )
