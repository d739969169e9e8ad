"""A Celery app with pikku's lease and sweep settings all left at their defaults.

Real ``celery worker`` and ``celery beat`` subprocesses load the module-level
``app``, built from their environment: ``PIKKU_D_BROKER``, ``PIKKU_D_DATABASE``,
``PIKKU_D_QUEUE`` (this test's own queue), ``PIKKU_D_MARKS`` (a folder for pid
marks) and ``PIKKU_D_KEYPREFIX`` (a Redis broker node's key prefix, so no other
worker on the shared Redis restores this test's unacknowledged messages). No
visibility timeout, no consumer timeout, no step_lease, no sweep_interval.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku, Workflow


@dataclass
class DefaultsApp:
    app: Celery
    pikku: Pikku
    queue: str
    takeover: Workflow[str, Any]


def build(env: Mapping[str, str]) -> DefaultsApp:
    marks = Path(env["PIKKU_D_MARKS"])
    queue = env["PIKKU_D_QUEUE"]
    app = Celery("pikku_defaults", broker=env["PIKKU_D_BROKER"], set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    if env.get("PIKKU_D_KEYPREFIX"):
        app.conf.broker_transport_options = {"global_keyprefix": env["PIKKU_D_KEYPREFIX"]}
    pikku = Pikku(app, env["PIKKU_D_DATABASE"])

    @app.task(name="d.hang_first", shared=False)
    def hang_first(key: str) -> str:
        """Attempt 1 marks its pid and blocks until its worker is killed."""
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return f"done {key}"

    @pikku.workflow(name="d.takeover")
    def takeover(ctx: Context, key: str) -> Any:
        return ctx.step("hang", hang_first, key, retries=2)

    return DefaultsApp(app, pikku, queue, takeover)


if os.environ.get("PIKKU_D_BROKER"):
    _built = build(os.environ)
    app = _built.app
    pikku = _built.pikku
