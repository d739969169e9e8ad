"""The statements of the SQL concurrency slots, named (see :mod:`.slots_sql`)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import RunStatus
from ..sql.schema import concurrency_key_table as K
from ..sql.schema import concurrency_slot_table as L
from ..sql.schema import run_table as R

TERMINAL = [s.value for s in RunStatus if s.terminal]


def _p(name: str, type_: Any = None) -> sa.BindParameter[Any]:
    return sa.bindparam(name, type_=type_)


class SlotStatements:
    """Every statement of the slots, built once per dialect's clock."""

    def __init__(self, now: ColumnElement[int]) -> None:
        # The key's row lock: the first write of every entry and exit of a key.
        self.lock_key = K.update().where(K.c.key == _p("p_key")).values(writes=K.c.writes + 1)
        self.lock_key_limit = (
            K.update()
            .where(K.c.key == _p("p_key"))
            .values(writes=K.c.writes + 1, max_running=_p("p_limit"))
        )
        self.insert_key = K.insert().values(key=_p("p_key"), max_running=_p("p_limit"), writes=0)
        self.slot_of_run = sa.select(L.c.run_id, L.c.key, L.c.seq, L.c.holding).where(
            L.c.run_id == _p("p_run_id")
        )
        self.slots_of_key = (
            sa.select(L.c.run_id, L.c.key, L.c.seq, L.c.holding)
            .where(L.c.key == _p("p_key"))
            .order_by(L.c.holding.desc(), L.c.seq)
        )
        # the same, with the key's limit on each row (an exit's one read)
        self.slots_and_limit = (
            sa.select(L.c.run_id, L.c.key, L.c.seq, L.c.holding, K.c.max_running)
            .select_from(L.join(K, K.c.key == L.c.key))
            .where(L.c.key == _p("p_key"))
            .order_by(L.c.holding.desc(), L.c.seq)
        )
        self.insert_slot = L.insert().values(
            run_id=_p("p_run_id"), key=_p("p_key"), seq=_p("p_seq"), holding=_p("p_holding")
        )
        self.delete_slot = L.delete().where(L.c.run_id == _p("p_run_id"))
        self.hold_slot = L.update().where(L.c.run_id == _p("p_run_id")).values(holding=True)
        queued = R.c.status == RunStatus.QUEUED.value
        self.admit_run = (
            R.update()
            .where(R.c.id == _p("p_run_id"), queued)
            # No new version: no pass has read a queued run, so a view of
            # it kept by the process that created it stays good for its
            # first pass (which writes what it decides against it).
            .values(status=RunStatus.RUNNING.value, updated_at=now)
        )
        self.end_queued_run = (
            R.update()
            .where(R.c.id == _p("p_run_id"), queued)
            .values(
                status=RunStatus.CANCELLED.value,
                error=_p("p_error"),
                version=R.c.version + 1,
                updated_at=now,
            )
        )
        self.stale_slots = (
            sa.select(L.c.run_id)
            .select_from(L.outerjoin(R, R.c.id == L.c.run_id))
            .where(sa.or_(R.c.id.is_(None), R.c.status.in_(TERMINAL)))
            .order_by(L.c.seq)
            .limit(_p("p_limit", sa.Integer()))
        )
        self.unslotted_runs = (
            sa.select(R)
            .select_from(R.outerjoin(L, L.c.run_id == R.c.id))
            .where(queued, L.c.run_id.is_(None), R.c.created_at <= now - _p("p_older_than_ms"))
            .order_by(R.c.created_at)
            .limit(_p("p_limit", sa.Integer()))
        )

    def named(self) -> dict[str, sa.ClauseElement]:
        """Every statement by name."""
        return {k: v for k, v in vars(self).items() if isinstance(v, sa.ClauseElement)}
