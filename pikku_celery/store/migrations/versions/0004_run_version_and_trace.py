"""Runs record the workflow version they started on and their trace context.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

``workflow_version`` pins a run's replays to the version of its workflow it
started on, so new code can be deployed while runs are in flight.
``trace_context`` keeps the run's OpenTelemetry context (a W3C carrier as
JSON), so a step the sweep re-sends joins the run's trace.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import JSON_TEXT, ExactString

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "pikku_workflow_run", sa.Column("workflow_version", ExactString(64), nullable=True)
    )
    op.add_column("pikku_workflow_run", sa.Column("trace_context", JSON_TEXT, nullable=True))


def downgrade() -> None:
    op.drop_column("pikku_workflow_run", "trace_context")
    op.drop_column("pikku_workflow_run", "workflow_version")
