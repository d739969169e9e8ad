"""The sweep's backoff per step, and its indexes ordered by it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02

The sweep backed off per run and read the oldest lapsed, lost or due steps
first, so steps it had just re-sent (and was waiting on) filled its batch
and newer ones were never reached, and a run's fan-out came back one step
per sweep. A step now carries its own backoff (``next_sweep_at``,
``sweep_count``), and each sweep index has ``next_sweep_at`` after the
status, so a query reads only steps it can act on, re-sent ones last.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

STEPS = "pikku_workflow_step"
RUNNING = sa.text("status = 'running'")
WAKING = sa.text("wake_at IS NOT NULL")
UNSENT = sa.text("status IN ('pending', 'scheduled')")

NEW = {
    "ix_pikku_step_sweep_lease": (["status", "next_sweep_at", "lease_expires_at"], RUNNING),
    "ix_pikku_step_sweep_wake": (["status", "next_sweep_at", "wake_at"], WAKING),
    "ix_pikku_step_sweep_scheduled": (
        ["status", "kind", "next_sweep_at", "scheduled_at", "created_at"],
        UNSENT,
    ),
}
OLD = {
    "ix_pikku_step_status_lease": (["status", "lease_expires_at"], RUNNING),
    "ix_pikku_step_status_wake": (["status", "wake_at"], WAKING),
    "ix_pikku_step_status_scheduled": (["status", "kind", "scheduled_at", "created_at"], UNSENT),
}


def _create(indexes: dict[str, tuple[list[str], sa.TextClause]]) -> None:
    for name, (columns, where) in indexes.items():
        op.create_index(name, STEPS, columns, postgresql_where=where, sqlite_where=where)


def _drop(indexes: dict[str, tuple[list[str], sa.TextClause]]) -> None:
    for name in indexes:
        op.drop_index(name, table_name=STEPS)


def upgrade() -> None:
    op.add_column(
        STEPS, sa.Column("next_sweep_at", sa.BigInteger(), nullable=False, server_default="0")
    )
    op.add_column(STEPS, sa.Column("sweep_count", sa.Integer(), nullable=False, server_default="0"))
    _drop(OLD)
    _create(NEW)


def downgrade() -> None:
    _drop(NEW)
    _create(OLD)
    op.drop_column(STEPS, "sweep_count")
    op.drop_column(STEPS, "next_sweep_at")
