"""The workflow store on MySQL/MariaDB: a claim, an outcome and a pass in one round trip each.

Only what MySQL does in fewer round trips than the portable store
(:mod:`.sql`): over PyMySQL connections that take multi-statement batches, a
standalone claim, a standalone outcome, the optimistic pass's read and its
write (:mod:`.sql_optimistic`) and a new run with its first step are each one
batch with its COMMIT
(:mod:`pikku_celery.sql.mysql_batch`); a claim of the step this store's
last pass scheduled keeps that pass's view of the run, so its own pass reads
nothing. In the locked pass an outcome writes its step and attempt rows in
one two-table ``UPDATE``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from ..errors import WorkflowStepFunctionMismatchError
from ..model.plan import Claim, PassView, claim_view
from ..sql.mysql_batch import Batch, BatchRunner, NamedRow, run_batch, takes_batches
from ..sql.runner import Runner, SQLAlchemyRunner
from .rows import STEP_COLUMNS, step_from
from .sql_optimistic import OptimisticSQLStore, PassShape
from .statements_mysql import MySQLStatements

PACKET_HEADROOM = 1024 * 1024
"""What a pass's batch carries besides one result: its other statements and values."""

RESULT_COPIES_IN_A_PACKET = 4
"""A result travels twice in a pass (its step row and its attempt row), each
copy escaped as a string literal, which at worst doubles it."""

# The columns of the packed claim read back (MySQLStatements.claim_batch).
PACKED_CLAIM = (*STEP_COLUMNS, "claimed_here")


@functools.cache
def _statements() -> MySQLStatements:
    return MySQLStatements()


class MySQLWorkflowStore(OptimisticSQLStore):
    """The SQL store on MySQL/MariaDB (:func:`~.sql_for.store_for` picks it)."""

    creates_tables = False
    statements: MySQLStatements
    prune_isolation = "READ COMMITTED"
    """InnoDB's REPEATABLE READ keeps a locking read's lock on every row it
    looked at, matched or not: a prune would hold a reopened run it passed over."""

    def _setup(self) -> None:
        super()._setup()
        self._claim_batch: Batch | None = None
        self._outcome_batches: dict[str, Batch] = {}
        self._pass_batches: dict[PassShape, Batch] = {}
        self._view_batch: Batch | None = None
        self._start_batch: Batch | None = None
        self._start_batches: dict[int, Batch] = {}  # with value steps beside
        self._value_ceiling: tuple[int, str] | None = None

    def max_value_bytes(self) -> tuple[int, str] | None:
        """What the server's ``max_allowed_packet`` leaves for one step result:
        a larger one would be refused mid-write as a lost connection
        ("server has gone away"), which looks like an outage, not bad input."""
        if self._value_ceiling is None:
            with self._engine.connect() as conn:
                packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
            room = max(0, packet - PACKET_HEADROOM) // RESULT_COPIES_IN_A_PACKET
            self._value_ceiling = (
                room,
                f"what the server's max_allowed_packet of {packet} bytes carries; "
                "raise max_allowed_packet on the server for larger results",
            )
        return self._value_ceiling

    def _make_statements(self) -> MySQLStatements:
        return _statements()

    def _make_runner(self) -> Runner:
        return BatchRunner(self._engine, SQLAlchemyRunner(self._single.begin))

    def _learn(self) -> None:
        """Batches where the connections take them (PyMySQL with its
        multi-statement flag, which :func:`pikku_celery.sql.engines.make_engine` sets)."""
        if self._engine.dialect.driver != "pymysql":
            return
        with self._engine.connect() as conn:
            if not takes_batches(conn):
                return
        self.use_batches(bool(getattr(self._engine.dialect, "is_mariadb", False)))

    def use_batches(self, inline_row_count: bool) -> None:
        """Send claims and outcomes as batches. MariaDB reads ``ROW_COUNT()``
        inside a statement as the previous statement's count (pinned by
        tests/store/test_mysql_batch.py): ``inline_row_count``; MySQL gets
        the session-variable form."""
        d, st = self._engine.dialect, self.statements
        # The claim answers with its read back, the batch's last statement
        # before COMMIT.
        self._claim_batch = Batch(d, st.claim_batch(inline_row_count), rows_of=-2)
        self._outcome_batches = {
            kind: Batch(d, st.outcome_batch(kind, inline_row_count)) for kind in st.fenced_step
        }
        # The optimistic pass's read and its COMMIT: one round trip, and the
        # pool then skips its ROLLBACK.
        self._view_batch = Batch(d, [st.pass_view, "COMMIT"], rows_of=0)
        self._start_batch = Batch(d, st.start_batch())

    @property
    def batched(self) -> bool:
        """Whether claims, outcomes and passes go as one batch each."""
        return self._claim_batch is not None

    @property
    def writes_passes(self) -> bool:
        return self.batched

    def _start_write(self, params: dict[str, Any], values: int = 0) -> None:
        assert self._start_batch is not None  # only with batches (writes_passes)
        batch = self._start_batches.get(values) if values else self._start_batch
        if batch is None:
            statements = self.statements.start_batch(values)
            batch = self._start_batches[values] = Batch(self._engine.dialect, statements)
        self.runner.rows(batch, params)

    def _read_pass_view(self, run_id: str) -> Sequence[Any]:
        batch = self._view_batch
        if batch is None:
            return super()._read_pass_view(run_id)
        with self._engine.connect() as conn:
            [(_, rows, names), _] = run_batch(conn, batch, {"p_id": run_id})
        assert rows is not None and names is not None
        return [NamedRow(names, row) for row in rows]

    def _pass_write(self, shape: PassShape, params: dict[str, Any]) -> tuple[bool, bool]:
        """One batch and its COMMIT (:meth:`MySQLStatements.pass_batch`)."""
        batch = self._pass_batches.get(shape)
        if batch is None:
            statements = self.statements.pass_batch(*shape)
            batch = self._pass_batches[shape] = Batch(self._engine.dialect, statements, rows_of=-2)
        [(pinned, fenced)] = self.runner.rows(batch, params)
        return pinned == 1, fenced == 1

    def _claim(self, params: dict[str, Any], known: PassView | None) -> Claim | None:
        """One batch; the claim reads no run, so its pass starts from
        ``known`` (the pass that scheduled the step) with the step as
        claimed, on the claim's time: the pass's write is pinned to that
        version. Without ``known``, the pass reads."""
        batch = self._claim_batch
        if batch is None:
            return super()._claim(params, known)
        rows = self.runner.rows(batch, params)
        if not rows:
            return None
        row = SimpleNamespace(**dict(zip(PACKED_CLAIM, json.loads(rows[0][0]), strict=True)))
        row.retry_delay, row.backoff = float(row.retry_delay), float(row.backoff)
        if not row.claimed_here:
            if row.task_name != params["p_task"]:
                raise WorkflowStepFunctionMismatchError(
                    params["p_id"], row.task_name, params["p_task"]
                )
            return None
        step = step_from(row)
        if known is None or known.view.run.id != step.run_id:
            return Claim(step)
        # the claim's time, on the database's clock
        return Claim(step, claim_view(known, step, int(step.updated_at)))

    def _fenced_write(
        self, conn: sa.Connection, kind: str, params: dict[str, Any], on_pass_clock: bool = False
    ) -> bool:
        st = self.statements
        both = st.fenced_both_at if on_pass_clock else st.fenced_both
        return conn.execute(both[kind], params).rowcount == 2

    def _renew(self, conn: sa.Connection, params: dict[str, Any]) -> bool:
        return conn.execute(self.statements.renew_both, params).rowcount == 2

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        batch = self._outcome_batches.get(kind)
        if batch is None:
            return super()._fenced_outcome(kind, params)
        [(matched,)] = self.runner.rows(batch, params)
        return bool(matched == 1)
