"""The SQL store's steps: their reads and the ownership writes, each one guarded statement."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ..errors import (
    WorkflowStepFunctionMismatchError,
    WorkflowStepSupersededError,
)
from ..model.changes import new_claim_id, superseded
from ..model.plan import Claim, PassView
from ..model.values import (
    BROKER,
    JSON,
    AttemptState,
    AttemptStatus,
    Delivery,
    ErrorInfo,
    StepState,
)
from ..payload import dumps
from . import events
from .rows import (
    attempt_from,
    step_from,
)
from .rules import lease_expired_error
from .sql_base import SQLBase, _prepared


class SQLSteps(SQLBase):
    """Claims, fenced outcomes and lease renewals, judged on the database's clock."""

    # --- steps ---------------------------------------------------------------
    @_prepared
    def get_steps(self, run_id: str) -> list[StepState]:
        with self._one() as conn:
            return [
                step_from(r) for r in conn.execute(self.statements.steps_of_run, {"p_id": run_id})
            ]

    @_prepared
    def get_step_outlines(self, run_id: str) -> list[StepState]:
        """The run's steps in order, their payloads left empty."""
        with self._one() as conn:
            rows = conn.execute(self.statements.step_outlines_of_run, {"p_id": run_id})
            return [step_from(r) for r in rows]

    @_prepared
    def get_steps_page(self, run_id: str, after_seq: int | None, limit: int) -> list[StepState]:
        """A page of the run's steps, in order, after ``after_seq``."""
        params = {"p_id": run_id, "p_after_seq": _after(after_seq), "p_limit": limit}
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.steps_page_of_run, params)]

    @_prepared
    def event_steps(self, run_id: str, key: str | None = None) -> list[StepState]:
        """The run's progress events (of ``key``, or of every key), in order."""
        params = {"p_id": run_id, "p_like": events.event_name_pattern(key)}
        with self._one() as conn:
            rows = conn.execute(self.statements.event_steps_of_run, params)
            # LIKE may fold case (MySQL's collations): the exact names decide.
            return events.of_key([step_from(r) for r in rows], key)

    def _run_of(self, step_id: str, run_id: str | None) -> str | None:
        """The run of the step: the caller's, else read by the step's id (a
        caller that did not name it pays this read, which fans out over every
        shard of a database distributed by run); None: no such step."""
        if run_id is not None:
            return run_id
        with self._one() as conn:
            found = conn.execute(self.statements.step_run_of, {"p_id": step_id}).scalar()
        return None if found is None else str(found)

    @_prepared
    def get_step(self, step_id: str, *, run_id: str | None = None) -> StepState | None:
        """The step, or None if there is no step with that id (in that run)."""
        run = self._run_of(step_id, run_id)
        if run is None:
            return None
        with self._one() as conn:
            row = conn.execute(self.statements.step_get, {"p_id": step_id, "p_run": run}).first()
        return None if row is None else step_from(row)

    @_prepared
    def get_attempts(self, run_id: str) -> list[AttemptState]:
        with self._one() as conn:
            rows = conn.execute(self.statements.attempts_of_run, {"p_id": run_id})
            return [attempt_from(r) for r in rows]

    @_prepared
    def get_attempts_page(
        self, run_id: str, after_seq: int | None, through_seq: int
    ) -> list[AttemptState]:
        """The attempts of one page of the run's steps, oldest first."""
        params = {"p_id": run_id, "p_after_seq": _after(after_seq), "p_through_seq": through_seq}
        with self._one() as conn:
            rows = conn.execute(self.statements.attempts_page_of_run, params)
            return [attempt_from(r) for r in rows]

    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        """The step :meth:`claim` claimed, without its view."""
        claimed = self.claim(
            step_id,
            task_name,
            worker,
            lease_ms,
            run_id=run_id,
            bound_ms=bound_ms,
            delivery=delivery,
        )
        return None if claimed is None else claimed.step

    @_prepared
    def claim(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
        known: PassView | None = None,
    ) -> Claim | None:
        """The guarded claim, and the run as it saw it where the dialect's
        claim reads it in the same round trip."""
        run = self._run_of(step_id, run_id)
        if run is None:
            return None
        params = {
            "p_id": step_id,
            "p_run": run,
            "p_task": task_name,
            "p_worker": worker,
            "p_lease_ms": lease_ms,
            "p_bound_ms": bound_ms,
            "p_claim": new_claim_id(),
            "p_task_id": None if delivery is None else delivery.task_id,
            "p_node": None if delivery is None else delivery.node,
        }
        return self._claim(params, known)

    def _claim(self, params: dict[str, Any], known: PassView | None) -> Claim | None:
        """The guarded claim, then the step read back and its attempt row
        written, in one transaction; its pass reads the run (``known`` is
        for the dialects whose claim can use it)."""
        st = self.statements
        with self._one() as conn:
            claimed = conn.execute(st.claim, params).rowcount == 1
            keys = {"p_id": params["p_id"], "p_run": params["p_run"]}
            row = conn.execute(st.step_get, keys).first() if claimed else None
            if row is None:
                self._refuse_other_task(conn, params)
                return None
            step = step_from(row)
            conn.execute(
                st.attempt_insert,
                {
                    "step_id": step.id,
                    "attempt": step.attempt,
                    "run_id": step.run_id,
                    "status": AttemptStatus.RUNNING.value,
                    "worker": params["p_worker"],
                    "started_at": step.updated_at,
                    "claim_id": step.claim_id,
                    "dispatch": BROKER,
                    "task_id": params["p_task_id"],
                    "node": params["p_node"],
                },
            )
            if step.attempt > 1:
                previous = {"p_id": step.id, "p_run": step.run_id, "p_attempt": step.attempt - 1}
                conn.execute(st.supersede, previous)
            return Claim(step)

    def _refuse_other_task(self, conn: sa.Connection, params: dict[str, Any]) -> None:
        """Nothing claimed: say so if the step was recorded with another task (rule 6)."""
        step_id, task_name = params["p_id"], params["p_task"]
        keys = {"p_id": step_id, "p_run": params["p_run"]}
        recorded = conn.execute(self.statements.step_task_name, keys).first()
        if recorded is not None and recorded.task_name != task_name:
            raise WorkflowStepFunctionMismatchError(step_id, recorded.task_name, task_name)

    @_prepared
    def refresh_step_lease(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int | None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> bool:
        run = self._run_of(step_id, run_id)
        if run is None:
            return False
        params = {
            "p_id": step_id,
            "p_run": run,
            "p_attempt": attempt,
            "p_lease_ms": lease_ms,
            "p_claim": claim_id,
        }
        with self._one() as conn:
            if lease_ms is None:
                return conn.execute(self.statements.park, params).rowcount == 1
            return self._renew(conn, params)

    def _renew(self, conn: sa.Connection, params: dict[str, Any]) -> bool:
        """Renew the lease and count it on the attempt row; False if refused.
        Here (SQLite) two statements in the transaction; PostgreSQL and
        MySQL write both rows in one."""
        if conn.execute(self.statements.renew, params).rowcount != 1:
            return False
        conn.execute(self.statements.renew_counted, params)
        return True

    def _fenced_write(
        self, conn: sa.Connection, kind: str, params: dict[str, Any], on_pass_clock: bool = False
    ) -> bool:
        """Run the fenced outcome ``kind`` (on the pass's 'now' when
        ``on_pass_clock``); False, nothing written, if superseded."""
        st = self.statements
        steps, attempts = (
            (st.fenced_at_step, st.fenced_at_attempt)
            if on_pass_clock
            else (st.fenced_step, st.fenced_attempt)
        )
        if conn.execute(steps[kind], params).rowcount != 1:
            return False
        conn.execute(attempts[kind], params)
        return True

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        """A standalone fenced outcome, in its own transaction."""
        with self._engine.begin() as conn:
            return self._fenced_write(conn, kind, params)

    @_prepared
    def complete_step(
        self,
        step_id: str,
        attempt: int,
        result: JSON,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        text = dumps(result, f"step {step_id}", "result")
        run = self._run_of(step_id, run_id)
        if run is None:
            raise superseded(step_id, None, attempt, claim_id)
        params = {
            "p_id": step_id,
            "p_run": run,
            "p_attempt": attempt,
            "p_result": text,
            "p_claim": claim_id,
        }
        if not self._fenced_outcome("complete", params):
            raise self._superseded(step_id, attempt, claim_id, run)

    def _superseded(
        self, step_id: str, attempt: int, claim_id: str | None, run_id: str
    ) -> WorkflowStepSupersededError:
        """The refusal of a fenced write, saying whether only its claim differed."""
        step = self.get_step(step_id, run_id=run_id) if claim_id is not None else None
        return superseded(step_id, step, attempt, claim_id)

    @_prepared
    def complete_in_transaction(
        self,
        step_id: str,
        attempt: int,
        body: Callable[[sa.Connection], JSON],
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> JSON:
        """Run ``body`` and the fenced success write in ONE transaction.

        The body's own writes on the connection commit together with the
        step's outcome, or not at all: an exception in the body, a result that
        is not JSON, or a superseded attempt (:class:`WorkflowStepSupersededError`)
        rolls everything back.
        """
        run = self._run_of(step_id, run_id)
        with self._engine.begin() as conn:
            if run is None:
                raise superseded(step_id, None, attempt, claim_id)
            result = body(conn)
            params = {
                "p_id": step_id,
                "p_run": run,
                "p_attempt": attempt,
                "p_result": dumps(result, f"step {step_id}", "result"),
                "p_claim": claim_id,
            }
            if not self._fenced_write(conn, "complete", params):
                # Raised inside: the body's writes roll back with the refusal.
                raise self._superseded(step_id, attempt, claim_id, run)
        return result

    @_prepared
    def fail_step(
        self,
        step_id: str,
        attempt: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        text = dumps(error, f"step {step_id}", "error")
        run = self._run_of(step_id, run_id)
        if run is None:
            raise superseded(step_id, None, attempt, claim_id)
        params = {
            "p_id": step_id,
            "p_run": run,
            "p_attempt": attempt,
            "p_error": text,
            "p_delay_ms": None if retry_delay is None else round(retry_delay * 1000),
            "p_claim": claim_id,
        }
        if not self._fenced_outcome("fail" if retry_delay is None else "fail_retry", params):
            raise self._superseded(step_id, attempt, claim_id, run)

    @_prepared
    def expire_step(
        self, step_id: str, bound_ms: int | None = None, *, run_id: str | None = None
    ) -> bool:
        st = self.statements
        run = self._run_of(step_id, run_id)
        if run is None:
            return False
        with self._engine.begin() as conn:
            row = conn.execute(st.step_get, {"p_id": step_id, "p_run": run}).first()
            if row is None:
                return False
            step = step_from(row)
            err = json.dumps(lease_expired_error(step.name, step.attempt))
            params = {
                "p_id": step_id,
                "p_run": run,
                "p_attempt": step.attempt,
                "p_error": err,
                "p_bound_ms": bound_ms,
            }
            if conn.execute(st.expire, params).rowcount != 1:
                return False
            conn.execute(st.expire_attempt, params)
            return True

    @_prepared
    def mark_scheduled(self, step_ids: Sequence[str]) -> None:
        if not step_ids:
            return
        with self._one() as conn:
            conn.execute(self.statements.mark_scheduled, {"p_ids": list(step_ids)})


def _after(after_seq: int | None) -> int:
    """A page's lower bound: below the first step's ``seq`` for None."""
    return -1 if after_seq is None else after_seq
