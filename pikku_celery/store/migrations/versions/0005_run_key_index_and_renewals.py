"""An index for finding runs by idempotency key alone; attempts count their renewals.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

The run page and ``runs list`` search a key across workflows, newest first;
the unique index on ``(workflow, idempotency_key)`` cannot serve that, so
the search scanned every run. ``(idempotency_key, created_at)`` serves it
and its order. An attempt row keeps how often its worker renewed its lease
and when it last did (``renewals``, ``renewed_at``), for the run page's
timeline: the renewal writes them in its own statement.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

ATTEMPTS = "pikku_workflow_step_attempt"


def upgrade() -> None:
    op.create_index(
        "ix_pikku_run_key_created", "pikku_workflow_run", ["idempotency_key", "created_at"]
    )
    op.add_column(ATTEMPTS, sa.Column("renewals", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(ATTEMPTS, sa.Column("renewed_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column(ATTEMPTS, "renewed_at")
    op.drop_column(ATTEMPTS, "renewals")
    op.drop_index("ix_pikku_run_key_created", table_name="pikku_workflow_run")
