"""Test helpers: poll with a deadline instead of sleeping; the long forms' switch."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

LONG = os.environ.get("PIKKU_LONG") == "1"
"""``PIKKU_LONG=1``: run the long forms too (minutes each; see docs/guide/testing.md)."""


def long_form(what: str) -> pytest.MarkDecorator:
    """Skip unless ``PIKKU_LONG=1``, saying what the long form does."""
    return pytest.mark.skipif(not LONG, reason=f"the long form ({what}): set PIKKU_LONG=1")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01) -> T:
    """Return the predicate's first truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def memory_broker_config(default_queue: str | None = None) -> dict[str, Any]:
    """Celery settings for the in-process test worker on the memory broker.

    Fast polling keeps each hop short; ``accept_content`` stays Celery's
    default (JSON only).
    """
    config: dict[str, Any] = {
        "broker_url": "memory://",
        "broker_transport_options": {"polling_interval": 0.01},
        "result_backend": "cache+memory://",
        "task_queues": None,
        "task_create_missing_queues": True,
    }
    if default_queue is not None:
        config["task_default_queue"] = default_queue
    return config


@contextmanager
def in_process_worker(app: Any, **options: Any) -> Iterator[Any]:
    """Celery's in-process test worker (``start_worker``), stopped at once at
    the end through the control API: left to itself, its loop notices the
    stop only at its next drain timeout, twice (4 s a test)."""
    from celery.contrib.testing.worker import start_worker

    with start_worker(app, **options) as w:
        try:
            yield w
        finally:
            app.control.shutdown(destination=[w.hostname])
