"""Schedules remember the newest tick they handled and the next one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03

``pikku_schedule`` holds one row per schedule: its workflow and spec as
registered, the newest tick handled (started or skipped), the next tick, and
the run of the newest started tick. Times are epoch milliseconds on the
database's clock.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import ExactString

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SCHEDULES = "pikku_schedule"


def upgrade() -> None:
    op.create_table(
        SCHEDULES,
        sa.Column("name", ExactString(), primary_key=True),
        sa.Column("workflow", ExactString(), nullable=False),
        sa.Column("spec", ExactString(), nullable=False),
        sa.Column("last_tick", sa.BigInteger(), nullable=False),
        sa.Column("next_tick", sa.BigInteger(), nullable=False),
        sa.Column("last_run_id", ExactString(36), nullable=True),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table(SCHEDULES)
