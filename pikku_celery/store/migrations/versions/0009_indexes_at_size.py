"""Indexes that keep the run page, the sweep and the deploy check fast at size.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-03

At a million runs the runs list with a filter, its counts, the deploy
check and the idle sweep walked most of the run table. The list and the
capped counts now read one index range per status (``status, created_at,
id`` and ``workflow, status, created_at, id``), the idle sweep and the
deploy check read partial indexes of live runs only (whole on
MySQL/MariaDB): runs not looked at since their last pass, runs due a look
again, and live runs by id; the idle sweep's probe reads a partial index of
live steps.
The single ``created_at`` index and the whole ``status, updated_at`` one
are replaced, and the children and idempotency-key indexes become partial
(a top-level or keyless run, most of them, takes no entry).
"""

from __future__ import annotations

from alembic import op

from pikku_celery.sql.schema import (
    CHILD_RUN,
    KEYED_RUN,
    LIVE_RUN,
    RECHECK_RUN,
    SETTLED_ROOT,
    UNLOOKED_RUN,
    UNSETTLED_STEP,
)

revision = "0009"
down_revision = "0007"
branch_labels = None
depends_on = None

RUNS = "pikku_workflow_run"
STEPS = "pikku_workflow_step"


def upgrade() -> None:
    op.drop_index("ix_pikku_run_status_updated", table_name=RUNS)
    op.drop_index("ix_pikku_run_created", table_name=RUNS)
    for name, columns, where in (
        ("ix_pikku_run_live_updated", ["status", "updated_at"], UNLOOKED_RUN),
        ("ix_pikku_run_live_recheck", ["status", "next_sweep_at"], RECHECK_RUN),
        ("ix_pikku_run_live_id", ["status", "id"], LIVE_RUN),
    ):
        op.create_index(name, RUNS, columns, postgresql_where=where, sqlite_where=where)
    op.create_index("ix_pikku_run_status_created", RUNS, ["status", "created_at", "id"])
    # retention's candidates: settled top-level runs only, so a live run's
    # passes write no entry here
    op.create_index(
        "ix_pikku_run_settled_root",
        RUNS,
        ["status", "updated_at", "id"],
        postgresql_where=SETTLED_ROOT,
        sqlite_where=SETTLED_ROOT,
    )
    op.create_index(
        "ix_pikku_run_workflow_status_created", RUNS, ["workflow", "status", "created_at", "id"]
    )
    # a pass rewrites its run's row, so each index entry a run need not have is
    # a write saved on the hot path: top-level and keyless runs take none here
    op.drop_index("ix_pikku_run_parent", table_name=RUNS)
    op.drop_index("ix_pikku_run_key_created", table_name=RUNS)
    op.create_index(
        "ix_pikku_run_parent",
        RUNS,
        ["parent_run_id"],
        postgresql_where=CHILD_RUN,
        sqlite_where=CHILD_RUN,
    )
    op.create_index(
        "ix_pikku_run_key_created",
        RUNS,
        ["idempotency_key", "created_at"],
        postgresql_where=KEYED_RUN,
        sqlite_where=KEYED_RUN,
    )
    op.create_index(
        "ix_pikku_step_live_run",
        STEPS,
        ["run_id"],
        postgresql_where=UNSETTLED_STEP,
        sqlite_where=UNSETTLED_STEP,
    )


def downgrade() -> None:
    op.drop_index("ix_pikku_step_live_run", table_name=STEPS)
    op.drop_index("ix_pikku_run_key_created", table_name=RUNS)
    op.drop_index("ix_pikku_run_parent", table_name=RUNS)
    op.create_index("ix_pikku_run_parent", RUNS, ["parent_run_id"])
    op.create_index("ix_pikku_run_key_created", RUNS, ["idempotency_key", "created_at"])
    for name in (
        "ix_pikku_run_settled_root",
        "ix_pikku_run_workflow_status_created",
        "ix_pikku_run_status_created",
        "ix_pikku_run_live_id",
        "ix_pikku_run_live_recheck",
        "ix_pikku_run_live_updated",
    ):
        op.drop_index(name, table_name=RUNS)
    op.create_index("ix_pikku_run_created", RUNS, ["created_at"])
    op.create_index("ix_pikku_run_status_updated", RUNS, ["status", "updated_at"])
