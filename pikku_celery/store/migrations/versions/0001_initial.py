"""pikku-celery's initial schema: leases, runs, steps, attempts, signals.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _key(length: int = 255) -> sa.types.TypeEngine[str]:
    # byte-for-byte comparison on MySQL/MariaDB, as on PostgreSQL and SQLite
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, charset="utf8mb4", collation="utf8mb4_bin"), "mysql", "mariadb"
    )


ID = _key(36)
NAME = _key()
STATUS = sa.String(16)
MS = sa.BigInteger()
JSON_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "pikku_lease",
        sa.Column("key", NAME, primary_key=True),
        sa.Column("holder", NAME, nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "pikku_workflow_run",
        sa.Column("id", ID, primary_key=True),
        sa.Column("workflow", NAME, nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("input", JSON_TEXT, nullable=True),
        sa.Column("output", JSON_TEXT, nullable=True),
        sa.Column("error", JSON_TEXT, nullable=True),
        sa.Column("idempotency_key", NAME, nullable=True),
        sa.Column("parent_run_id", ID, nullable=True),
        sa.Column("parent_step_id", ID, nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("wake_at", MS, nullable=True),
        sa.Column("next_sweep_at", MS, nullable=True),
        sa.Column("sweep_count", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("created_at", MS, nullable=False),
        sa.Column("updated_at", MS, nullable=False),
        sa.UniqueConstraint("workflow", "idempotency_key", name="uq_pikku_run_idempotency"),
    )
    op.create_index("ix_pikku_run_status_updated", "pikku_workflow_run", ["status", "updated_at"])
    op.create_index("ix_pikku_run_created", "pikku_workflow_run", ["created_at"])
    op.create_index("ix_pikku_run_parent", "pikku_workflow_run", ["parent_run_id"])
    op.create_table(
        "pikku_workflow_step",
        sa.Column("id", ID, primary_key=True),
        sa.Column("run_id", ID, sa.ForeignKey("pikku_workflow_run.id"), nullable=False),
        sa.Column("name", NAME, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", STATUS, nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("task_name", NAME, nullable=True),
        sa.Column("queue", NAME, nullable=True),
        sa.Column("args", JSON_TEXT, nullable=True),
        sa.Column("kwargs", JSON_TEXT, nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("retry_delay", sa.Double(), nullable=False),
        sa.Column("backoff", sa.Double(), nullable=False),
        sa.Column("lease_expires_at", MS, nullable=True),
        sa.Column("wake_at", MS, nullable=True),
        sa.Column("child_run_id", ID, nullable=True),
        sa.Column("result", JSON_TEXT, nullable=True),
        sa.Column("error", JSON_TEXT, nullable=True),
        sa.Column("worker", NAME, nullable=True),
        sa.Column("scheduled_at", MS, nullable=True),
        sa.Column("created_at", MS, nullable=False),
        sa.Column("updated_at", MS, nullable=False),
        sa.UniqueConstraint("run_id", "name", name="uq_pikku_step_run_name"),
    )
    # partial on PostgreSQL/SQLite (see schema.py), whole on MySQL/MariaDB
    op.create_index(
        "ix_pikku_step_status_lease",
        "pikku_workflow_step",
        ["status", "lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    )
    op.create_index(
        "ix_pikku_step_status_wake",
        "pikku_workflow_step",
        ["status", "wake_at"],
        postgresql_where=sa.text("wake_at IS NOT NULL"),
        sqlite_where=sa.text("wake_at IS NOT NULL"),
    )
    op.create_index(
        "ix_pikku_step_status_scheduled",
        "pikku_workflow_step",
        ["status", "kind", "scheduled_at", "created_at"],
        postgresql_where=sa.text("status IN ('pending', 'scheduled')"),
        sqlite_where=sa.text("status IN ('pending', 'scheduled')"),
    )
    op.create_table(
        "pikku_workflow_step_attempt",
        sa.Column("step_id", ID, primary_key=True),  # no FK: see schema.py
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("run_id", ID, nullable=False),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("worker", NAME, nullable=True),
        sa.Column("result", JSON_TEXT, nullable=True),
        sa.Column("error", JSON_TEXT, nullable=True),
        sa.Column("started_at", MS, nullable=False),
        sa.Column("finished_at", MS, nullable=True),
    )
    op.create_table(
        "pikku_workflow_signal",
        sa.Column("run_id", ID, sa.ForeignKey("pikku_workflow_run.id"), primary_key=True),
        sa.Column("name", NAME, primary_key=True),
        sa.Column("payload", JSON_TEXT, nullable=True),
        sa.Column("created_at", MS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("pikku_workflow_signal")
    op.drop_table("pikku_workflow_step_attempt")
    op.drop_table("pikku_workflow_step")
    op.drop_table("pikku_workflow_run")
    op.drop_table("pikku_lease")
