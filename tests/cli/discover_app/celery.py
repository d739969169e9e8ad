"""The app: ``app.autodiscover_tasks([...billing])``; nothing imports ``billing.tasks``.

The store is the SQLite file ``PIKKU_LOAD_TEST_DB``; the broker kombu's
in-memory transport, which nobody consumes.
"""

from __future__ import annotations

import os

from celery import Celery

from pikku_celery import Pikku

app = Celery("discover_app", broker="memory://")
app.conf.update(task_default_queue="celery", task_routes={"billing.invoice": {"queue": "billing"}})
app.autodiscover_tasks(["tests.cli.discover_app.billing"])
pikku = Pikku(app, f"sqlite:///{os.environ['PIKKU_LOAD_TEST_DB']}")
