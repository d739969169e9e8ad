"""Concurrency slots on SQL, in the store's database (every dialect alike).

Each call is one transaction whose first write is an ``UPDATE`` of the key's
row: the row lock on PostgreSQL and MySQL/MariaDB, the write lock (``BEGIN
IMMEDIATE``) on SQLite. Whoever holds it reads the key's slots as the last
holder left them, decides with :mod:`.slots`'s pure functions, and writes the
slots and the runs' status in the same commit: a run holds a slot exactly
when it left ``queued`` for ``running``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from ..errors import StoreError
from ..model.slots import OnLimit, Slot, SlotEntry, evicted_error, plan_entry, plan_promotion
from ..model.values import ErrorInfo, RunState
from ..retry import ROLLED_BACK
from ..sql.engines import READ_ONLY_OPTION, now_ms_expr
from ..sql.transient import rolled_back
from .rows import run_from
from .statements_slots import SlotStatements

_T = TypeVar("_T")


@functools.cache
def slot_statements(dialect_name: str) -> SlotStatements:
    """The slots' statements for a dialect (built once)."""
    return SlotStatements(now_ms_expr(dialect_name))


SAVEPOINT_GONE = 1305  # MySQL/MariaDB: SAVEPOINT ... does not exist


def savepoint_lost(exc: BaseException) -> bool:
    """The database rolled the whole transaction back under a savepoint (a
    MySQL/MariaDB deadlock victim inside it), so releasing the savepoint
    failed: run the transaction again, as for any deadlock victim."""
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
    return bool(args) and args[0] == SAVEPOINT_GONE


def _slot(row: Any) -> Slot:
    return Slot(row.run_id, row.key, int(row.seq), bool(row.holding))


class SQLConcurrencySlots:
    """:class:`~.slots.ConcurrencySlots` on a SQLAlchemy engine (the store's)."""

    def __init__(self, engine: sa.Engine, prepare: Callable[[], None] = lambda: None) -> None:
        self._engine = engine
        self._reader = engine.execution_options(**{READ_ONLY_OPTION: True})
        self._prepare = prepare
        self.statements = slot_statements(engine.dialect.name)
        """Every statement of the slots, by name: ``statements.named()``."""

    def _retried(self, body: Callable[[], _T]) -> _T:
        self._prepare()
        return ROLLED_BACK.call(body, lambda exc: rolled_back(exc) or savepoint_lost(exc))

    def _lock(self, conn: sa.Connection, key: str, limit: int | None = None) -> bool:
        """Lock ``key``'s row (counting the entry, and setting its limit, with
        ``limit``); False when it has no row yet."""
        st = self.statements
        if limit is None:
            done = conn.execute(st.lock_key, {"p_key": key})
        else:
            done = conn.execute(st.lock_key_limit, {"p_key": key, "p_limit": limit})
        return bool(done.rowcount)

    def _lock_or_make(self, conn: sa.Connection, key: str, limit: int) -> None:
        """Lock ``key``'s row, making it first if it has none: a row this
        transaction inserts is locked by it until it commits, and a racing
        maker's insert fails (or waits, then fails) on the primary key, after
        which its row is there to lock."""
        if self._lock(conn, key, limit):
            return
        try:
            with conn.begin_nested():
                conn.execute(self.statements.insert_key, {"p_key": key, "p_limit": limit})
            return
        except sa.exc.IntegrityError:
            pass
        if not self._lock(conn, key, limit):
            raise StoreError(f"concurrency key {key!r}: its row was neither found nor made")

    def _admit(self, conn: sa.Connection, run_id: str) -> None:
        conn.execute(self.statements.admit_run, {"p_run_id": run_id})

    def _end(self, conn: sa.Connection, run_id: str, error: ErrorInfo) -> bool:
        done = conn.execute(
            self.statements.end_queued_run, {"p_run_id": run_id, "p_error": json.dumps(error)}
        )
        return bool(done.rowcount)

    def _key_of(self, run_id: str) -> str | None:
        """The key a run is on, read before its key's transaction: a
        transaction's reads must come after its lock (on MySQL/MariaDB the
        first read fixes the snapshot every later read sees)."""
        with self._reader.begin() as conn:
            row = conn.execute(self.statements.slot_of_run, {"p_run_id": run_id}).first()
        return None if row is None else str(row.key)

    def enter_slot(self, run_id: str, key: str, limit: int, on_limit: OnLimit) -> SlotEntry:
        st = self.statements

        def enter() -> SlotEntry:
            with self._engine.begin() as conn:
                self._lock_or_make(conn, key, limit)
                on = [_slot(r) for r in conn.execute(st.slots_of_key, {"p_key": key})]
                mine = [s for s in on if s.run_id == run_id]
                if mine:
                    return SlotEntry(admitted=mine[0].holding, queued=not mine[0].holding)
                # the newest place: slots are read under the key's lock, and
                # only the waiting ones' order matters
                seq = max((s.seq for s in on), default=0) + 1
                holders = [s for s in on if s.holding]
                plan = plan_entry(holders, [s for s in on if not s.holding], limit, on_limit)
                for evicted in plan.evict:
                    conn.execute(st.delete_slot, {"p_run_id": evicted})
                    self._end(conn, evicted, evicted_error(key))
                for rid in plan.promote:
                    conn.execute(st.hold_slot, {"p_run_id": rid})
                    self._admit(conn, rid)
                if plan.holding or plan.queued:
                    conn.execute(
                        st.insert_slot,
                        {"p_run_id": run_id, "p_key": key, "p_seq": seq, "p_holding": plan.holding},
                    )
                if plan.holding:
                    self._admit(conn, run_id)
                elif not plan.queued:
                    self._end(conn, run_id, evicted_error(key))
                return SlotEntry(plan.holding, plan.queued, plan.evict, plan.cancel, plan.promote)

        return self._retried(enter)

    def leave_slot(self, run_id: str) -> list[str]:
        st = self.statements

        def leave() -> list[str]:
            key = self._key_of(run_id)
            if key is None:
                return []
            with self._engine.begin() as conn:
                self._lock(conn, key)
                if not conn.execute(st.delete_slot, {"p_run_id": run_id}).rowcount:
                    return []  # another exit took it while this one waited
                rows = conn.execute(st.slots_and_limit, {"p_key": key}).all()
                if not rows:
                    return []
                limit = int(rows[0].max_running)
                on = [_slot(r) for r in rows]
                holders = sum(1 for s in on if s.holding)
                admitted = plan_promotion(holders, [s for s in on if not s.holding], limit)
                for rid in admitted:
                    conn.execute(st.hold_slot, {"p_run_id": rid})
                    self._admit(conn, rid)
                return admitted

        return self._retried(leave)

    def cancel_queued(self, run_id: str, error: ErrorInfo) -> bool:
        st = self.statements

        def cancel() -> bool:
            key = self._key_of(run_id)
            with self._engine.begin() as conn:
                if key is not None:
                    self._lock(conn, key)
                if not self._end(conn, run_id, error):
                    return False
                conn.execute(st.delete_slot, {"p_run_id": run_id})
                return True

        return self._retried(cancel)

    def stale_slots(self, limit: int) -> list[str]:
        self._prepare()
        with self._reader.begin() as conn:
            return [r.run_id for r in conn.execute(self.statements.stale_slots, {"p_limit": limit})]

    def unslotted_runs(self, older_than_ms: int, limit: int) -> list[RunState]:
        self._prepare()
        params = {"p_older_than_ms": older_than_ms, "p_limit": limit}
        with self._reader.begin() as conn:
            return [run_from(r) for r in conn.execute(self.statements.unslotted_runs, params)]

    def slots_of(self, key: str) -> list[Slot]:
        self._prepare()
        with self._reader.begin() as conn:
            return [_slot(r) for r in conn.execute(self.statements.slots_of_key, {"p_key": key})]
