"""Runs keep the chain ``ctx.continue_as_new`` makes.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

``continued_as`` is the run a run started in its place as it ended;
``continued_from`` is the run a run was started in place of. Both are
written in the transaction of the pass that ends the predecessor, and read
with the run by id (no index: nothing searches by them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from pikku_celery.sql.schema import ExactString

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

RUNS = "pikku_workflow_run"


def upgrade() -> None:
    op.add_column(RUNS, sa.Column("continued_as", ExactString(36), nullable=True))
    op.add_column(RUNS, sa.Column("continued_from", ExactString(36), nullable=True))


def downgrade() -> None:
    op.drop_column(RUNS, "continued_from")
    op.drop_column(RUNS, "continued_as")
