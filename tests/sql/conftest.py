"""The pins of pikku_celery.sql.compat run on the newest SQLAlchemy and on the
lowest pikku allows (``scripts/test``): the report header says which."""

from __future__ import annotations

import sqlalchemy as sa


def pytest_report_header() -> str:
    return f"sqlalchemy: {sa.__version__} ({sa.__file__})"
