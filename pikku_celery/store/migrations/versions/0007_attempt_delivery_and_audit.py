"""Attempts name their Celery message and node; operators' actions are kept.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

An attempt row records the id of the Celery message that carried it (for an
eager attempt, its carrier's) and Celery's node name of the worker that ran
it, so a person can find its log lines. ``pikku_workflow_audit`` keeps what
operators did to a run (cancel, retry, signal): who, when, from where and
with what, append-only, so a retried run keeps the trace of its failure.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from pikku_celery.sql.schema import ExactString

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

ATTEMPTS = "pikku_workflow_step_attempt"
AUDIT = "pikku_workflow_audit"


def upgrade() -> None:
    op.add_column(ATTEMPTS, sa.Column("task_id", ExactString(), nullable=True))
    op.add_column(ATTEMPTS, sa.Column("node", ExactString(), nullable=True))
    op.create_table(
        AUDIT,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("run_id", ExactString(36), nullable=False),
        sa.Column("action", ExactString(16), nullable=False),
        sa.Column("actor", ExactString(), nullable=False),
        sa.Column("origin", ExactString(), nullable=True),
        sa.Column("details", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")),
        sa.Column("at", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_pikku_audit_run", AUDIT, ["run_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_pikku_audit_run", table_name=AUDIT)
    op.drop_table(AUDIT)
    op.drop_column(ATTEMPTS, "node")
    op.drop_column(ATTEMPTS, "task_id")
