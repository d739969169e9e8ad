"""Names compare exactly on MySQL/MariaDB; runs record their depth and what blocks them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

``utf8mb4_bin`` pads with spaces on MariaDB (and MySQL before 8.0), so the
idempotency keys ``'k'`` and ``'k '`` were one key and the steps ``'a'`` and
``'a '`` one step. ``depth`` bounds child recursion (``max_child_depth``); ``blocked`` says why no
pass can run a run now (no worker knows its workflow); a step's ``route`` keeps
the routing options of ``ctx.step`` (exchange, routing key, priority).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (table, column, length, nullable) of every name, id and key column
KEY_COLUMNS = [
    ("pikku_lease", "key", 255, False),
    ("pikku_lease", "holder", 255, False),
    ("pikku_workflow_run", "id", 36, False),
    ("pikku_workflow_run", "workflow", 255, False),
    ("pikku_workflow_run", "idempotency_key", 255, True),
    ("pikku_workflow_run", "parent_run_id", 36, True),
    ("pikku_workflow_run", "parent_step_id", 36, True),
    ("pikku_workflow_step", "id", 36, False),
    ("pikku_workflow_step", "run_id", 36, False),
    ("pikku_workflow_step", "name", 255, False),
    ("pikku_workflow_step", "task_name", 255, True),
    ("pikku_workflow_step", "queue", 255, True),
    ("pikku_workflow_step", "child_run_id", 36, True),
    ("pikku_workflow_step", "worker", 255, True),
    ("pikku_workflow_step_attempt", "step_id", 36, False),
    ("pikku_workflow_step_attempt", "run_id", 36, False),
    ("pikku_workflow_step_attempt", "worker", 255, True),
    ("pikku_workflow_signal", "run_id", 36, False),
    ("pikku_workflow_signal", "name", 255, False),
]


def _collation(bind: sa.Connection, padded: bool) -> str:
    if padded:
        return "utf8mb4_bin"
    return "utf8mb4_nopad_bin" if getattr(bind.dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def _recollate(padded: bool) -> None:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    collation = _collation(bind, padded)
    # A column a foreign key refers to cannot change its collation: the keys
    # are dropped, the columns changed, and the keys made again as they were.
    inspector = sa.inspect(bind)
    keys = [
        (table, str(fk["name"]), fk)
        for table in ("pikku_workflow_step", "pikku_workflow_signal")
        for fk in inspector.get_foreign_keys(table)
    ]
    for table, name, _ in keys:
        op.drop_constraint(name, table, type_="foreignkey")
    for table, column, length, nullable in KEY_COLUMNS:
        op.alter_column(
            table,
            column,
            existing_type=mysql.VARCHAR(length),
            type_=mysql.VARCHAR(length, charset="utf8mb4", collation=collation),
            existing_nullable=nullable,
        )
    for table, name, fk in keys:
        op.create_foreign_key(
            name,
            table,
            fk["referred_table"],
            fk["constrained_columns"],
            fk["referred_columns"],
        )


def upgrade() -> None:
    _recollate(padded=False)
    op.add_column(
        "pikku_workflow_run",
        sa.Column("depth", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column(
        "pikku_workflow_run",
        sa.Column(
            "blocked", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=True
        ),
    )
    op.add_column(
        "pikku_workflow_step",
        sa.Column(
            "route", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=True
        ),
    )


def downgrade() -> None:
    op.drop_column("pikku_workflow_step", "route")
    op.drop_column("pikku_workflow_run", "blocked")
    op.drop_column("pikku_workflow_run", "depth")
    _recollate(padded=True)
