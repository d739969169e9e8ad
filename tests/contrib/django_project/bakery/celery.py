"""The project's Celery app. Its broker is closed: under task_always_eager nothing is sent.

Its tasks modules are found as Celery finds a Django project's: by
``autodiscover_tasks()`` over the installed apps.
"""

from __future__ import annotations

from celery import Celery

app = Celery("bakery")
app.conf.update(
    broker_url="amqp://guest:guest@127.0.0.1:1//",
    broker_connection_retry=False,
    task_always_eager=True,
)
app.autodiscover_tasks()
