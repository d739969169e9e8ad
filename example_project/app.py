"""The shop's Celery app and its pikku engine.

With no environment set, everything is embedded: an SQLite file holds the
workflows and another SQLite file is the broker, both under ``.pikku-demo/``.
Point ``PIKKU_DEMO_BROKER`` / ``PIKKU_DEMO_DATABASE`` at real servers
(``redis://...``, ``postgresql+psycopg://...``) to run the same code there.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

import pikku_celery.broker  # noqa: F401  (registers the sqlite-queue:// transport)
from pikku_celery import Pikku

HOME = Path(os.environ.get("PIKKU_DEMO_HOME", Path.cwd() / ".pikku-demo")).resolve()
BROKER_URL = os.environ.get("PIKKU_DEMO_BROKER") or f"sqlite-queue:///{HOME / 'broker.db'}"
DATABASE_URL = os.environ.get("PIKKU_DEMO_DATABASE") or f"sqlite:///{HOME / 'shop.db'}"
VISIBILITY_TIMEOUT = float(os.environ.get("PIKKU_DEMO_VISIBILITY", "6"))
SWEEP_INTERVAL = float(os.environ.get("PIKKU_DEMO_SWEEP", "2"))

HOME.mkdir(parents=True, exist_ok=True)

app = Celery("shop", broker=BROKER_URL)
app.conf.update(
    broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT, "polling_interval": 0.02},
    task_routes={"shop.create_label": {"queue": "shipping"}},
    task_default_queue="celery",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)

pikku = Pikku(
    app,
    DATABASE_URL,
    sweep_interval=SWEEP_INTERVAL,
    sweep_backoff=1.0,
    message_grace=5.0,
    idle_after=5.0,
)

# Register the shop's tasks and workflows with the app.
from example_project.shop import tasks, workflows  # noqa: E402, F401
