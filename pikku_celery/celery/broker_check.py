"""A worker whose broker's client libraries are missing stops at start, naming the extra."""

from __future__ import annotations

from typing import Any

from celery import Celery

from ..extras import MissingExtraError, require_broker_extra
from .queues import transport_name


def broker_check_on_worker_start(app: Celery) -> Any:
    """A ``celeryd_init`` receiver: a worker of ``app`` stops at once, saying
    which extra to install, when its broker's client libraries are missing.

    Celery logs and swallows a receiver's ``Exception``; this one exits, as the
    worker would a moment later with kombu's bare ``ImportError``.
    """

    def check(instance: Any = None, **_: Any) -> None:
        if getattr(instance, "app", None) is not app:
            return
        try:
            require_broker_extra(app, transport_name(app))
        except MissingExtraError as exc:
            raise SystemExit(f"pikku-celery: {exc}") from None

    return check
