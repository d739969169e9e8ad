"""Claims carry a random claim id; attempts record it and how they were dispatched.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Every outcome and lease renewal is fenced on the attempt *and* the claim id,
so a claim the database lost in a crash (a claim committed asynchronously)
cannot be confused with the new claim of the same attempt number.
``dispatch`` says how an attempt reached its worker (``broker`` or ``eager``).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import ExactString

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Compared byte for byte, as every key and name column (schema.ExactString).
    op.add_column("pikku_workflow_step", sa.Column("claim_id", ExactString(32), nullable=True))
    op.add_column(
        "pikku_workflow_step_attempt", sa.Column("claim_id", ExactString(32), nullable=True)
    )
    op.add_column(
        "pikku_workflow_step_attempt", sa.Column("dispatch", ExactString(16), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("pikku_workflow_step_attempt", "dispatch")
    op.drop_column("pikku_workflow_step_attempt", "claim_id")
    op.drop_column("pikku_workflow_step", "claim_id")
