"""Celery app run by ``celery worker`` subprocesses in the broker tests.

Configured from the environment so the test decides where the files live:
``PIKKU_TEST_BROKER_DB`` (the broker file), ``PIKKU_TEST_VISIBILITY`` and
``PIKKU_TEST_BUSY_TIMEOUT`` (seconds).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery

import pikku_celery.broker  # noqa: F401  (registers sqlite-queue://)

BROKER_DB = os.environ.get("PIKKU_TEST_BROKER_DB", "broker-test.db")
VISIBILITY = float(os.environ.get("PIKKU_TEST_VISIBILITY", "2"))
BUSY_TIMEOUT = float(os.environ.get("PIKKU_TEST_BUSY_TIMEOUT", "30"))
QUEUE = "broker-test"

app = Celery("broker_test", broker=f"sqlite-queue:///{BROKER_DB}")
app.conf.update(
    broker_transport_options={
        "visibility_timeout": VISIBILITY,
        "polling_interval": 0.02,
        "busy_timeout": BUSY_TIMEOUT,
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
)


@app.task(name="broker_test.block")
def block(marker_dir: str, token: str) -> None:
    """Record the start, wait until the test releases it, record the finish.

    The waits are bounded so a forgotten worker cannot hang forever.
    """
    directory = Path(marker_dir)
    with (directory / "started").open("a") as f:
        f.write(f"{token} {os.getpid()} {os.getpgid(0)}\n")
    deadline = time.monotonic() + 60
    while not (directory / "release").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("never released")
        time.sleep(0.02)
    with (directory / "done").open("a") as f:
        f.write(f"{token} {os.getpid()} {os.getpgid(0)}\n")


@app.task(name="broker_test.mark")
def mark(marker_dir: str, token: str) -> None:
    """Record that it ran."""
    with (Path(marker_dir) / "done").open("a") as f:
        f.write(f"{token} {os.getpid()} {os.getpgid(0)}\n")
