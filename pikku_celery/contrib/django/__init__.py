"""pikku-celery for Django.

Add ``"pikku_celery.contrib.django"`` to ``INSTALLED_APPS`` and configure
``PIKKU_CELERY`` (see :mod:`pikku_celery.contrib.django.conf`). Then:

- ``get_pikku()``: the project's Pikku, built once from the settings;
- ``start_on_commit(workflow, input, idempotency_key=...)``: start a run only
  when the surrounding transaction commits;
- ``manage.py pikku_celery ...``: the ``pikku-celery`` command line, pointed
  at this project's Pikku and database (``manage.py pikku_celery db upgrade``).

``pikku_celery.contrib.django:pikku`` is the project's Pikku as an attribute,
resolved on first access, so the CLI can be pointed at it with ``-A``.
"""

from __future__ import annotations

from typing import Any

from .commit import PendingRun, start_on_commit
from .conf import (
    configured_database_url,
    database_url_for_alias,
    get_pikku,
    pikku_from_settings,
)
from .database_urls import database_url

__all__ = [
    "PendingRun",
    "configured_database_url",
    "database_url",
    "database_url_for_alias",
    "get_pikku",
    "pikku_from_settings",
    "start_on_commit",
]


def __getattr__(name: str) -> Any:
    """``pikku``: the project's Pikku, built on first access (PEP 562)."""
    if name == "pikku":
        return get_pikku()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
