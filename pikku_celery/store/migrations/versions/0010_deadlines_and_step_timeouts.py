"""Runs keep their deadline; steps their timeout.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

``deadline_at`` (epoch milliseconds on the database's clock) is when a run
started with a timeout fails with ``WorkflowDeadlineError``; the sweep finds
runs past it through ``ix_pikku_run_deadline``, which only runs with a
deadline enter (partial on PostgreSQL and SQLite). ``timeout_ms`` is how long
one attempt of a step may run (``ctx.step(..., timeout=)``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

RUNS = "pikku_workflow_run"
STEPS = "pikku_workflow_step"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("deadline_at", sa.BigInteger(), nullable=True))
    op.create_index(
        "ix_pikku_run_deadline",
        RUNS,
        ["status", "deadline_at"],
        postgresql_where=sa.text("deadline_at IS NOT NULL"),
        sqlite_where=sa.text("deadline_at IS NOT NULL"),
    )
    op.add_column(STEPS, sa.Column("timeout_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column(STEPS, "timeout_ms")
    op.drop_index("ix_pikku_run_deadline", table_name=RUNS)
    op.drop_column(RUNS, "deadline_at")
