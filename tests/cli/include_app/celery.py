"""The app: ``include=["tests.cli.include_app.flows"]`` and nothing else.

The store is the SQLite file ``PIKKU_LOAD_TEST_DB``; the broker
``PIKKU_LOAD_TEST_BROKER`` (default kombu's in-memory transport, which
nobody consumes).
"""

from __future__ import annotations

import os

from celery import Celery

import pikku_celery.broker  # noqa: F401  (registers sqlite-queue://)
from pikku_celery import Pikku

app = Celery(
    "include_app",
    broker=os.environ.get("PIKKU_LOAD_TEST_BROKER", "memory://"),
    include=["tests.cli.include_app.flows"],
)
app.conf.update(task_default_queue="celery", broker_transport_options={"visibility_timeout": 60})
pikku = Pikku(
    app,
    f"sqlite:///{os.environ['PIKKU_LOAD_TEST_DB']}",
    sweep_interval=1.0,
    message_grace=3.0,
)
