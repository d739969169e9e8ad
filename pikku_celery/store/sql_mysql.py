"""The workflow store on MySQL/MariaDB: a claim and an outcome in one round trip each.

Only what MySQL does in fewer round trips than the portable store
(:mod:`.sql`): over PyMySQL connections that take multi-statement batches, a
standalone claim and a standalone outcome are each one batch with its COMMIT
(:mod:`.batch`); inside a pass an outcome writes its step and attempt rows
in one two-table ``UPDATE``.
"""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from ..errors import WorkflowStepFunctionMismatchError
from ..sql.mysql_batch import Batch, BatchRunner, takes_batches
from ..sql.runner import Runner, SQLAlchemyRunner
from .model import StepState
from .rows import STEP_COLUMNS, step_from
from .sql import SQLWorkflowStore
from .statements_mysql import MySQLStatements

# The columns of the packed claim read back (MySQLStatements.claim_batch).
PACKED_CLAIM = (*STEP_COLUMNS, "claimed_here")


@functools.cache
def _statements() -> MySQLStatements:
    return MySQLStatements()


class MySQLWorkflowStore(SQLWorkflowStore):
    """The SQL store on MySQL/MariaDB (``SQLWorkflowStore(engine)`` picks it)."""

    creates_tables = False
    statements: MySQLStatements

    def _setup(self) -> None:
        self._claim_batch: Batch | None = None
        self._outcome_batches: dict[str, Batch] = {}

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

    @property
    def batched(self) -> bool:
        """Whether claims and outcomes go as one batch each."""
        return self._claim_batch is not None

    def _claim(self, params: dict[str, Any]) -> StepState | None:
        batch = self._claim_batch
        if batch is None:
            return super()._claim(params)
        rows = self.runner.rows(batch, params)
        if not rows:
            return None
        row = SimpleNamespace(**dict(zip(PACKED_CLAIM, json.loads(rows[0][0]), strict=True)))
        row.retry_delay, row.backoff = float(row.retry_delay), float(row.backoff)
        if not row.claimed_here:
            if params["p_run"] in (None, row.run_id) and row.task_name != params["p_task"]:
                raise WorkflowStepFunctionMismatchError(
                    params["p_id"], row.task_name, params["p_task"]
                )
            return None
        return step_from(row)

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
