"""Every unique key of a run's rows carries the run; idempotency keys get their own table.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03

A database sharded by run (Citus) enforces a primary key or a unique
constraint only if it holds the run. The primary keys of steps, attempts and
audit rows gain ``run_id`` after their own columns (a lookup by step id
still seeks the key). ``(workflow, idempotency_key)`` cannot hold the run:
it moves to ``pikku_workflow_run_key`` (sharded by its key there), copied
from the runs that have one; the run keeps its ``idempotency_key`` column
for display and search, without the unique constraint.

MySQL/MariaDB drops and adds a primary key in one ``ALTER TABLE`` (an
AUTO_INCREMENT column must stay in a key); SQLite rebuilds the tables
(batch mode), keeping their rows, indexes and audit ids.
"""

from __future__ import annotations

import warnings

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import UNSETTLED_STEP, ExactString

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

RUNS = "pikku_workflow_run"
KEYS = "pikku_workflow_run_key"
UNIQUE_KEY = "uq_pikku_run_idempotency"
PRIMARY_KEYS = {
    # table: (its key before, its key now)
    "pikku_workflow_step": (["id"], ["id", "run_id"]),
    "pikku_workflow_step_attempt": (["step_id", "attempt"], ["step_id", "attempt", "run_id"]),
    "pikku_workflow_audit": (["id"], ["id", "run_id"]),
}
AUDIT = "pikku_workflow_audit"
STEPS = "pikku_workflow_step"
LIVE_RUN = "ix_pikku_step_live_run"


def _live_run_index(columns: list[str]) -> None:
    """The live steps by run, whose columns now end with the step's id: a
    statement that names a step and its run, planned through it, seeks
    the one entry."""
    op.drop_index(LIVE_RUN, table_name=STEPS)
    op.create_index(
        LIVE_RUN, STEPS, columns, postgresql_where=UNSETTLED_STEP, sqlite_where=UNSETTLED_STEP
    )


def _dialect() -> str:
    return op.get_bind().dialect.name


def _set_primary_key(table: str, columns: list[str]) -> None:
    name = f"{table}_pkey"
    dialect = _dialect()
    if dialect in ("mysql", "mariadb"):
        op.execute(f"ALTER TABLE {table} DROP PRIMARY KEY, ADD PRIMARY KEY ({', '.join(columns)})")
    elif dialect == "sqlite":
        # the copy is made from the reflected table, then its key replaced
        warnings.filterwarnings("ignore", "Table '_alembic_tmp_", sa.exc.SAWarning)
        with op.batch_alter_table(table, recreate="always") as batch:
            if table == AUDIT:  # a two-column key: no rowid alias, numbered by the insert
                batch.alter_column(
                    "id",
                    type_=sa.BigInteger() if len(columns) > 1 else sa.Integer(),
                    existing_nullable=False,
                )
            batch.create_primary_key(name, columns)
    else:
        op.drop_constraint(name, table, type_="primary")
        op.create_primary_key(name, table, columns)


def upgrade() -> None:
    op.create_table(
        KEYS,
        sa.Column("workflow", ExactString(255), primary_key=True),
        sa.Column("idempotency_key", ExactString(255), primary_key=True),
        sa.Column("run_id", ExactString(36), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
    )
    op.execute(
        f"INSERT INTO {KEYS} (workflow, idempotency_key, run_id, created_at) "
        f"SELECT workflow, idempotency_key, id, created_at FROM {RUNS} "
        "WHERE idempotency_key IS NOT NULL"
    )
    if _dialect() == "sqlite":
        with op.batch_alter_table(RUNS, recreate="always") as batch:
            batch.drop_constraint(UNIQUE_KEY, type_="unique")
    else:
        op.drop_constraint(UNIQUE_KEY, RUNS, type_="unique")
    for table, (_, now) in PRIMARY_KEYS.items():
        _set_primary_key(table, now)
    _live_run_index(["run_id", "id"])


def downgrade() -> None:
    _live_run_index(["run_id"])
    for table, (before, _) in PRIMARY_KEYS.items():
        _set_primary_key(table, before)
    if _dialect() == "sqlite":
        with op.batch_alter_table(RUNS, recreate="always") as batch:
            batch.create_unique_constraint(UNIQUE_KEY, ["workflow", "idempotency_key"])
    else:
        op.create_unique_constraint(UNIQUE_KEY, RUNS, ["workflow", "idempotency_key"])
    op.drop_table(KEYS)
