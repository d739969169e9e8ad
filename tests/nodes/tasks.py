"""Tasks of the first-steps test, shared as pytest-celery's tutorial writes them."""

from __future__ import annotations

import os
from typing import Any

import celery.utils
from celery import shared_task


@shared_task
def noop(*args: Any, **kwargs: Any) -> None:
    return celery.utils.noop(*args, **kwargs)


@shared_task
def whoami() -> int:
    """The pid of the pool process that ran it."""
    return os.getpid()
