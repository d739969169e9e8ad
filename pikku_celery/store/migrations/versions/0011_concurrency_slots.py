"""Concurrency per key: a row per key, a slot row per run on a key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03

``pikku_concurrency_key`` is the row every entry and exit of a key locks
first (its limit, and a count of those writes);
``pikku_concurrency_slot`` holds one row per live run on a key, holding a
slot or waiting for one, in start order.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import ExactString

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

KEYS = "pikku_concurrency_key"
SLOTS = "pikku_concurrency_slot"


def upgrade() -> None:
    op.create_table(
        KEYS,
        sa.Column("key", ExactString(), primary_key=True),
        sa.Column("max_running", sa.Integer(), nullable=False),
        sa.Column("writes", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        SLOTS,
        sa.Column("run_id", ExactString(36), primary_key=True),
        sa.Column("key", ExactString(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("holding", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_pikku_slot_key", SLOTS, ["key", "holding", "seq"])


def downgrade() -> None:
    op.drop_index("ix_pikku_slot_key", table_name=SLOTS)
    op.drop_table(SLOTS)
    op.drop_table(KEYS)
