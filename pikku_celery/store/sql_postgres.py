"""The workflow store on PostgreSQL: one round trip for each hot operation.

Only what PostgreSQL does in fewer round trips than the portable store
(:mod:`.sql`): single statements in autocommit, on libpq's prepared
statements with psycopg (:class:`~pikku_celery.sql.runner.LibpqRunner`); a
claim that also reads what its pass needs (handed to that pass); the
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

from ..model.plan import KEPT_MARGIN_MS, Claim, PassView, PassWrite, claim_view, kept_view
from ..model.values import (
    AdvanceResult,
    NewRun,
    RunState,
)
from ..ports.store import SettleWatch
from ..sql.pooler import warn_if_pooled
from ..sql.runner import LibpqRunner, Runner, SQLAlchemyRunner
from ..sql.settle import SETTLED_CHANNEL, SettleListener, settle_notice
from .rows import STEP_COLUMNS, run_from, step_from
from .sql_optimistic import OptimisticSQLStore, PassShape
from .statements_postgres import CLAIM_VIEW_STEPS, PostgresStatements


@functools.cache
def _statements() -> PostgresStatements:
    return PostgresStatements()


class PostgresWorkflowStore(OptimisticSQLStore):
    """The SQL store on PostgreSQL (:func:`~.sql_for.store_for` picks it)."""

    creates_tables = False
    statements: PostgresStatements

    def _setup(self) -> None:
        super()._setup()
        self._settle: SettleListener | None = None

    def _make_statements(self) -> PostgresStatements:
        return _statements()

    def _learn(self) -> None:
        """Behind a pooler that no ``pooler=`` names: a warning
        (:func:`~pikku_celery.sql.pooler.warn_if_pooled`)."""
        super()._learn()
        if self.pooler is None:
            warn_if_pooled(self._engine)

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
        if new.idempotency_key is None and new.timeout_ms is None:
            [made] = self.runner.rows(self.statements.run_insert_returning, params)
            return made.created_at, made.updated_at
        return super()._insert_run(new, key, params)

    def _insert_run_row(
        self, conn: sa.Connection, new: NewRun, params: dict[str, Any]
    ) -> tuple[int, int]:
        if new.timeout_ms is not None:
            # Its deadline is placed from the clock read before the insert.
            return super()._insert_run_row(conn, new, params)
        created, updated = conn.execute(self.statements.run_insert_returning, params).one()
        return created, updated

    def _start_write(self, params: dict[str, Any], values: int = 0) -> None:
        self.runner.rows(self.statements.run_start_with(values), params)

    # --- steps ---------------------------------------------------------------
    def _claim(self, params: dict[str, Any], known: PassView | None) -> Claim | None:
        """One statement: the guarded update, the new attempt row, the
        superseded mark of a lapsed attempt's row, and the run as its pass
        will need it (handed to that pass: it skips its read). With
        ``known`` at the run's version, the claim reads no steps."""
        params["p_known"] = -1 if known is None else known.view.run.version
        st = self.statements
        rows = self.runner.rows(
            st.claim_view_durable if self.durable_claims else st.claim_view, params
        )
        if rows:
            return self._claim_with_view(rows, known)
        with self._one() as conn:
            self._refuse_other_task(conn, params)
        return None

    def _claim_with_view(self, rows: Sequence[Any], known: PassView | None) -> Claim:
        """The claimed step, and the run as the PostgreSQL claim read it."""
        head = rows[0]
        m = head._mapping
        claimed = SimpleNamespace(**{name: m["c_" + name] for name in STEP_COLUMNS})
        step = step_from(claimed)
        now = int(head.db_now)
        if known is not None and head.r_version == known.view.run.version:
            # The claim read no steps and no input: no pass has landed since ours.
            return Claim(step, claim_view(known, step, now))
        if len(rows) > CLAIM_VIEW_STEPS or step.seq >= CLAIM_VIEW_STEPS:
            return Claim(step)  # a big run: the claim read at most its first steps
        steps = [step if r.id == step.id else step_from(r) for r in rows if r.id is not None]
        signals = self._read_signals(step.run_id) if head.has_signals else {}
        run, size = run_from(head, "r_"), len(m["r_input"] or "")
        good_until = int(step.lease_expires_at or 0) - KEPT_MARGIN_MS
        return Claim(step, kept_view(run, steps, signals, now, size, good_until, reread=True))

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
    def _write_locked(self, plan: PassWrite) -> AdvanceResult | None:
        """The locked write, then the settle NOTIFY of a run it ended (the
        one write sends its own)."""
        done = super()._write_locked(plan)
        if done is not None and plan.ends:
            self._notify_settled(done.run)
        return done

    def _end_params(
        self, run_id: str, status: str, output: str | None, error: str | None
    ) -> dict[str, Any]:
        return {"p_notice": settle_notice(run_id, status, output, error)}

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
        ``run_id`` (registered before the caller reads its status); else None.

        Behind transaction pooling None: a LISTEN would stay on a server
        connection the client does not keep, so ``wait()`` polls."""
        if self.pooler == "transaction":
            yield None
            return
        if self._settle is None:
            self._settle = SettleListener(self._engine)
        with self._settle.watch(run_id) as wait:
            yield wait

    def _pass_write(self, shape: PassShape, params: dict[str, Any]) -> tuple[bool, bool]:
        """One statement (:meth:`PostgresStatements.pass_write`), in autocommit."""
        [row] = self.runner.rows(self.statements.pass_write(*shape), params)
        return bool(row.pinned), bool(row.fenced)
