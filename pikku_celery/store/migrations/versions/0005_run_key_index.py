"""An index for finding runs by idempotency key alone.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

The run page and ``runs list`` search a key across workflows, newest first;
the unique index on ``(workflow, idempotency_key)`` cannot serve that, so
the search scanned every run. ``(idempotency_key, created_at)`` serves it
and its order.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_pikku_run_key_created", "pikku_workflow_run", ["idempotency_key", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_pikku_run_key_created", table_name="pikku_workflow_run")
