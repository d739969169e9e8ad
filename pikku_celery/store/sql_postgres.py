"""The workflow store on PostgreSQL: one round trip for each hot operation.

Only what PostgreSQL does in fewer round trips than the portable store
(:mod:`.sql`): single statements in autocommit, on libpq's prepared
statements with psycopg (:class:`~pikku_celery.sql.runner.LibpqRunner`); a
claim that also reads what its pass needs (:mod:`.kept_views`); the
optimistic pass (:mod:`.sql_optimistic`) written as one statement; a new run
and its first pass as one statement; a run's end announced with NOTIFY for
``RunHandle.wait``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from ..sql.runner import LibpqRunner, Runner, SQLAlchemyRunner
from ..sql.settle import SETTLED_CHANNEL, SettleListener, settle_notice
from .base import Decide, SettleWatch
from .kept_views import (
    FirstPass,
    Passed,
)
from .model import (
    AdvanceResult,
    NewRun,
    RunState,
    StepOutcome,
    StepState,
)
from .rows import STEP_COLUMNS, run_from, step_from
from .rules import EncodedDecision
from .sql_optimistic import OptimisticSQLStore, PassShape
from .statements_postgres import CLAIM_VIEW_STEPS, PostgresStatements


@functools.cache
def _statements() -> PostgresStatements:
    return PostgresStatements()


class PostgresWorkflowStore(OptimisticSQLStore):
    """The SQL store on PostgreSQL (``SQLWorkflowStore(engine)`` picks it)."""

    creates_tables = False
    statements: PostgresStatements

    def _setup(self) -> None:
        super()._setup()
        self._settle: SettleListener | None = None

    def _make_statements(self) -> PostgresStatements:
        return _statements()

    def _single_statement_engine(self) -> sa.Engine:
        # Single statements in autocommit save the BEGIN and COMMIT round
        # trips (psycopg's autocommit switch is local, no round trip).
        return self._engine.execution_options(isolation_level="AUTOCOMMIT")

    def _make_runner(self) -> Runner:
        fallback = SQLAlchemyRunner(self._single.begin)
        if self._engine.dialect.driver == "psycopg":
            return LibpqRunner(self._engine, fallback)
        return fallback

    # --- runs ----------------------------------------------------------------
    def _insert_run(
        self, new: NewRun, key: dict[str, Any], params: dict[str, Any]
    ) -> RunState | tuple[int, int]:
        st = self.statements
        if new.idempotency_key is None:
            [made] = self.runner.rows(st.run_insert_returning, params)
            return made.created_at, made.updated_at
        with self._one() as conn:
            row = conn.execute(st.run_by_key, key).first()
            if row is not None:
                return run_from(row)
            created, updated = conn.execute(st.run_insert_returning, params).one()
            return created, updated

    def _start_write(self, params: dict[str, Any]) -> None:
        self.runner.rows(self.statements.run_start, params)

    # --- steps ---------------------------------------------------------------
    def _claim(self, params: dict[str, Any]) -> StepState | None:
        """One statement: the guarded update, the new attempt row, the
        superseded mark of a lapsed attempt's row, and the run as its pass
        will need it (kept for that pass: it skips its read)."""
        passed = self._passed.take(params["p_id"])
        params["p_known"] = -1 if passed is None else passed.run.version
        st = self.statements
        rows = self.runner.rows(
            st.claim_view_durable if self.durable_claims else st.claim_view, params
        )
        if rows:
            return self._keep_claim_view(rows, passed)
        with self._one() as conn:
            self._refuse_other_task(conn, params)
        return None

    def _keep_claim_view(self, rows: Sequence[Any], passed: Passed | None) -> StepState:
        """The claimed step; the run as the PostgreSQL claim read it is kept
        for that attempt's pass."""
        head = rows[0]
        self._clock.saw(int(head.db_now))
        m = head._mapping
        claimed = SimpleNamespace(**{name: m["c_" + name] for name in STEP_COLUMNS})
        step = step_from(claimed)
        run = None
        input_size = len(m["r_input"] or "")
        if passed is not None and head.r_version == passed.run.version:
            # The claim read no steps and no input: no pass has landed since ours.
            run, input_size = passed.run, passed.input_size
            steps = passed.steps_claimed(step)
        elif len(rows) > CLAIM_VIEW_STEPS or step.seq >= CLAIM_VIEW_STEPS:
            # A big run: the claim read at most its first steps; its pass reads.
            self._keep_view(step, None, [], 0, False, 0)
            return step
        else:
            steps = [step if r.id == step.id else step_from(r) for r in rows if r.id is not None]
        self._keep_view(
            step,
            run or run_from(head, "r_"),
            steps,
            int(head.db_now),
            bool(head.has_signals),
            input_size,
        )
        return step

    def _fenced_write(
        self, conn: sa.Connection, kind: str, params: dict[str, Any], on_pass_clock: bool = False
    ) -> bool:
        st = self.statements
        ctes = st.fenced_cte_at if on_pass_clock else st.fenced_cte
        return int(conn.execute(ctes[kind], params).scalar_one()) == 1

    def _renew(self, conn: sa.Connection, params: dict[str, Any]) -> bool:
        return int(conn.execute(self.statements.renew_counted_cte, params).scalar_one()) == 1

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        with self._one() as conn:  # one statement: autocommit
            return self._fenced_write(conn, kind, params)

    # --- the orchestration pass ---------------------------------------------
    def _locked_pass(
        self, run_id: str, outcome: StepOutcome | None, decide: Decide, first: FirstPass | None
    ) -> AdvanceResult:
        """The locked pass, then the settle NOTIFY of a run it ended (the
        optimistic write sends its own)."""
        done = super()._locked_pass(run_id, outcome, decide, first)
        if done.decision is not None and done.run.status.terminal:
            self._notify_settled(done.run)
        return done

    def _end_params(self, run_id: str, status: str, encoded: EncodedDecision) -> dict[str, Any]:
        return {"p_notice": settle_notice(run_id, status, encoded.output, encoded.error)}

    # --- waiting for a run to settle (PostgreSQL LISTEN/NOTIFY) ---------------
    def _notify_settled(self, run: RunState) -> None:
        """Tell waiting ``RunHandle.wait`` calls, once per run, after commit."""
        output = json.dumps(run.output, separators=(",", ":"))
        error = None if run.error is None else json.dumps(run.error, separators=(",", ":"))
        notice = settle_notice(run.id, run.status.value, output, error)
        params = {"channel": SETTLED_CHANNEL, "notice": notice}
        # On failure: waiters re-check the run's status at least every second.
        with suppress(sa.exc.DBAPIError):
            self.runner.rows(self.statements.notify_settled, params)

    def close(self) -> None:
        """Stop the settle listener (its thread and LISTEN connection) and
        close the pool; a later ``wait()`` listens again."""
        settle = self._settle
        try:
            if settle is not None:
                settle.close()
        finally:
            super().close()

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[SettleWatch | None]:
        """On PostgreSQL, ``wait(timeout)`` returning when a pass settles
        ``run_id`` (registered before the caller reads its status); else None."""
        if self._settle is None:
            self._settle = SettleListener(self._engine)
        with self._settle.watch(run_id) as wait:
            yield wait

    def _pass_write(self, shape: PassShape, params: dict[str, Any]) -> tuple[bool, bool]:
        """One statement (:meth:`PostgresStatements.pass_write`), in autocommit."""
        [row] = self.runner.rows(self.statements.pass_write(*shape), params)
        return bool(row.pinned), bool(row.fenced)
