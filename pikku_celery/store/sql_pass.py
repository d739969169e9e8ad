"""The SQL store's side of a pass: read the run, write a plan pinned to its version."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from ..errors import (
    DuplicateStepError,
    RunNotFoundError,
    StoreError,
)
from ..model.changes import superseded
from ..model.plan import Moved, ParentSettle, PassView, PassWrite, Resolved
from ..model.values import (
    JSON,
    AdvanceResult,
    AttemptStatus,
    RunView,
    StepStatus,
)
from ..payload import read_stored
from ..ports.store import SettleWatch
from ..retry import ROLLED_BACK
from ..sql.transient import rolled_back
from .rows import (
    SIGNAL_PLACE,
    attempt_row_params,
    outcome_params,
    resolve_attempt_params,
    resolve_params,
    run_from,
    run_params,
    step_from,
    step_params,
)
from .sql_base import _prepared
from .sql_steps import SQLSteps
from .successor_sql import write_successor


class SQLPasses(SQLSteps):
    """A pass's read and the locked write of its plan (a dialect may add a one-write path)."""

    # --- the orchestration pass ---------------------------------------------
    @_prepared
    def read_pass(
        self, run_id: str, known: PassView | None = None, optimistic: bool = False
    ) -> PassView:
        """The run as read, locked pass or not (``known`` is for the stores
        with a one-write pass)."""
        return PassView(self._read_view(run_id))

    @_prepared
    def write_pass(self, read: PassView, plan: PassWrite) -> AdvanceResult | Moved:
        """The plan in one transaction. A deadlock (a child run ending while
        its parent cancels it, each holding its own run row) rolls back and
        writes the same plan again (:data:`pikku_celery.retry.ROLLED_BACK`):
        it is pinned to the version its view read, so it lands at most once."""
        try:
            done = ROLLED_BACK.call(lambda: self._write(read, plan), rolled_back)
        except (sa.exc.DataError, sa.exc.IntegrityError) as exc:
            # A value the database will not take: the same on every replay,
            # so a store error (the engine then fails the run).
            first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else ""
            raise StoreError(
                f"the database refused what the pass of run {plan.run.id} decided: {first_line}"
            ) from exc
        return Moved(plan.run.id) if done is None else done

    def _write(self, read: PassView, plan: PassWrite) -> AdvanceResult | None:
        """One try of the write (the locked write here); None: the run moved."""
        return self._write_locked(plan)

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[SettleWatch | None]:
        """None: this store sends no settle notifications (waiters poll)."""
        yield None

    def _read_view(self, run_id: str) -> RunView:
        """The run, its steps and signals as a pass sees them, unlocked."""
        st = self.statements
        with self._one() as conn:
            row = conn.execute(st.run_get, {"p_id": run_id}).first()
            if row is None:
                raise RunNotFoundError(f"no workflow run {run_id!r}")
            run = run_from(row)
            rows = conn.execute(st.pass_read, {"p_id": run_id}).all()
            signals: dict[str, JSON] = {}
            if rows[0].has_signals and not run.status.terminal:
                for name, payload in conn.execute(st.signals_of_run, {"p_id": run_id}):
                    signals[name] = read_stored(payload, SIGNAL_PLACE, run_id, name)
        steps = [step_from(r) for r in rows if r.id is not None]
        now = int(rows[0].db_now)
        return RunView(run=run, steps=steps, signals=signals, now=now, reread=True)

    def _write_locked(self, plan: PassWrite) -> AdvanceResult | None:
        """``plan`` in one transaction under the run's row lock; None, with
        nothing written, when the run's version moved since its view."""
        with self._engine.begin() as conn:
            version = conn.execute(self.statements.run_version_lock, {"p_id": plan.run.id})
            if version.scalar() != plan.version:
                return None  # another pass or a signal landed: read and decide again
            return self._write_plan(conn, plan)

    def _write_plan(self, conn: sa.Connection, plan: PassWrite) -> AdvanceResult:
        """Every write of ``plan``, each statement batched per table."""
        st, now = self.statements, plan.now
        if plan.outcome is not None:
            done = plan.outcome
            fenced = {**outcome_params(done, now), "p_run": plan.run.id}
            if not self._fenced_write(conn, done.kind, fenced, True):
                o = done.outcome
                raise superseded(o.step_id, None, o.attempt, o.claim_id)
        if plan.decision is None:
            return plan.landed([], False)
        if plan.resolved:
            conn.execute(st.resolve, [_of_run(resolve_params(r, now), r) for r in plan.resolved])
            ended = [_of_run(resolve_attempt_params(r, now), r) for r in plan.resolved if r.attempt]
            if ended:
                conn.execute(st.resolve_attempt, ended)
        self._insert_steps(conn, plan)
        if plan.redispatch:
            sent = [s.id for s in plan.redispatch]
            conn.execute(st.redispatch, {"p_ids": sent, "p_now": now})
        cancelled = [
            child_id
            for child_id in plan.cancel_children
            if conn.execute(st.cancel_child, {"p_id": child_id, "p_now": now}).rowcount == 1
        ]
        if plan.close_open is not None:
            closed = {"p_id": plan.run.id, "p_now": now, "p_error": json.dumps(plan.close_open)}
            conn.execute(st.close_live_steps, closed)
            conn.execute(st.close_live_attempts, closed)
        if plan.ends:
            status = plan.run.status.value
            ended_run = {"p_output": plan.output, "p_error": plan.error, "p_status": status}
            conn.execute(st.run_end, {"p_id": plan.run.id, "p_now": now, **ended_run})
            if plan.successor is not None:
                write_successor(conn, plan)
        else:
            woke = {"p_id": plan.run.id, "p_now": now, "p_wake_at": plan.run.wake_at}
            conn.execute(st.run_pass, woke)
        woken = plan.parent is not None and self._settle_parent_step(conn, plan.parent, now)
        return plan.landed(cancelled, woken)

    def _insert_steps(self, conn: sa.Connection, plan: PassWrite) -> None:
        """The pass's new steps, their child runs and first attempts."""
        if not plan.inserts:
            return
        now = plan.now
        child_runs = [
            {**run_params(row.child, row.child_input, now), "created_at": now, "updated_at": now}
            for row in plan.inserts
            if row.child is not None and row.child_input is not None
        ]
        if child_runs:
            conn.execute(self.statements.run_insert, child_runs)
        steps = [step_params(r.step, r.args, r.kwargs, r.value) for r in plan.inserts]
        try:
            conn.execute(self.statements.step_insert, steps)
        except sa.exc.IntegrityError as exc:
            raise DuplicateStepError(
                f"workflow run {plan.run.id} already has one of the steps "
                f"{[r.step.name for r in plan.inserts]!r}"
            ) from exc
        attempts = [attempt_row_params(r.attempt, r.step.run_id) for r in plan.inserts if r.attempt]
        if attempts:
            conn.execute(self.statements.attempt_insert, attempts)

    def _settle_parent_step(self, conn: sa.Connection, settle: ParentSettle, now: int) -> bool:
        """The ended child run settles its parent's parked step, if it still
        waits on this child."""
        st = self.statements
        params = {
            "p_id": settle.step_id,
            "p_parent": settle.run_id,
            "p_child": settle.child_run_id,
            "p_status": (StepStatus.SUCCEEDED if settle.ok else StepStatus.FAILED).value,
            "p_result": settle.result_text,
            "p_error": settle.error_text,
            "p_now": now,
        }
        if conn.execute(st.settle_parent_step, params).rowcount != 1:
            return False
        attempt_status = (AttemptStatus.SUCCEEDED if settle.ok else AttemptStatus.FAILED).value
        conn.execute(st.settle_parent_attempt, {**params, "p_status": attempt_status})
        conn.execute(st.touch_parent, {"p_id": settle.run_id, "p_now": now})
        return True


def _of_run(params: dict[str, Any], resolved: Resolved) -> dict[str, Any]:
    """A resolved step's binds with its run (``p_run``), which pins its rows."""
    return {**params, "p_run": resolved.step.run_id}
