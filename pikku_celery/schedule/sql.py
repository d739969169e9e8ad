"""Schedules' progress in ``pikku_schedule`` (SQLite, PostgreSQL, MySQL/MariaDB).

Portable SQLAlchemy Core, named in one registry (``schedule.*``) and run
through the narrow connector: a guarded ``UPDATE`` (only forward), and an
``INSERT`` when no row exists, whose loser of a race retries the update.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from ..sql.connector import Connector, Transaction, connect
from ..sql.dialect import Dialect
from ..sql.schema import schedule_table as T
from ..store.sql import check_schema
from .model import ScheduleState

NOW = "schedule.now"
ROWS = "schedule.rows"
EXISTS = "schedule.exists"
ADVANCE = "schedule.advance"
"""Forward to a newer tick (a skipped tick keeps the run id)."""
NAME_RUN = "schedule.name_run"
"""Forward, or name the run of the same tick."""
INSERT = "schedule.insert"


def schedule_statements(dialect: Dialect) -> dict[str, sa.Executable]:
    """The schedule store's statements, by name."""
    now = dialect.now_ms
    p = sa.bindparam
    values = {
        "workflow": p("workflow"),
        "spec": p("spec"),
        "last_tick": p("last_tick"),
        "next_tick": p("next_tick"),
        "updated_at": now,
    }
    return {
        NOW: sa.select(now.label("now")),
        ROWS: sa.select(T),
        EXISTS: sa.select(T.c.name).where(T.c.name == p("p_name")),
        ADVANCE: T.update()
        .where(T.c.name == p("p_name"), T.c.last_tick < p("last_tick"))
        .values(**values, last_run_id=sa.func.coalesce(p("last_run_id"), T.c.last_run_id)),
        NAME_RUN: T.update()
        .where(T.c.name == p("p_name"), T.c.last_tick <= p("last_tick"))
        .values(**values, last_run_id=p("last_run_id")),
        INSERT: T.insert().values(name=p("p_name"), **values, last_run_id=p("last_run_id")),
    }


class SQLScheduleStore:
    """:class:`~.store.ScheduleStore` over a SQLAlchemy engine, on the database's clock.

    ``connector``: run the statements through this one instead of one made
    for ``engine`` (a test's recording connector).
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        upgrade_command: str | None = None,
        connector: Connector | None = None,
    ) -> None:
        self._engine = engine
        self._upgrade_command = upgrade_command
        self._checked = False
        self.connector = connector or connect(engine, prefix="pikku_schedule_")
        """What runs the statements (named ``schedule.*``)."""
        self.connector.register(schedule_statements(self.connector.dialect))

    def _check(self) -> None:
        """A database upgraded before schedules existed: :class:`SchemaMissingError`
        naming the command to run, once, rather than an SQL error at each pass."""
        if not self._checked:
            check_schema(self._engine, (T,), self._upgrade_command)
            self._checked = True

    def now_ms(self) -> int:
        """The database's clock, in epoch milliseconds."""
        self._check()
        row = self.connector.one(NOW, {})
        assert row is not None
        return int(row.now)

    def schedule_states(self) -> dict[str, ScheduleState]:
        """Every row, by name."""
        self._check()
        return {r.name: _state(r) for r in self.connector.all(ROWS, {})}

    def note_tick(self, state: ScheduleState) -> bool:
        """Write ``state`` if newer; insert the row when there is none."""
        params: dict[str, Any] = {
            "p_name": state.name,
            "workflow": state.workflow,
            "spec": state.spec,
            "last_tick": state.last_tick_ms,
            "next_tick": state.next_tick_ms,
            "last_run_id": state.last_run_id,
        }
        self._check()
        update = ADVANCE if state.last_run_id is None else NAME_RUN

        def forward(tx: Transaction) -> bool | None:
            if tx.run(update, params):
                return True
            return False if tx.one(EXISTS, params) is not None else None

        done = self.connector.transaction(forward)
        if done is not None:
            return done
        try:
            self.connector.run(INSERT, params)
            return True
        except sa.exc.IntegrityError:  # another beat inserted it first
            return bool(self.connector.run(update, params))


def _state(row: Any) -> ScheduleState:
    return ScheduleState(
        name=row.name,
        workflow=row.workflow,
        spec=row.spec,
        last_tick_ms=int(row.last_tick),
        next_tick_ms=int(row.next_tick),
        last_run_id=row.last_run_id,
        updated_at_ms=int(row.updated_at),
    )
