"""The Celery app of the load probe (benchmarks/load_probe.py) and its worker.

The probe builds one app per store in its own process with :func:`build`; the
worker (``celery -A benchmarks.loadapp``) gets the same app built from the
environment, only when Celery asks for ``app``, so importing this module
builds nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku, Workflow

STEPS = 3


@dataclass
class LoadApp:
    app: Celery
    pikku: Pikku
    inc: Any  # the Celery task (Celery ships no type hints)
    three: Workflow


def build(broker: str, database: str, queue: str) -> LoadApp:
    """A Celery app on ``broker`` (also the result backend), a pikku engine on
    ``database``, and the probe's task and workflow, all on ``queue``."""
    app = Celery("load", broker=broker, backend=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_transport_options={"visibility_timeout": 300},
        worker_prefetch_multiplier=1,
        result_expires=600,
        broker_connection_retry_on_startup=True,
    )
    pikku = Pikku(app, database, install_beat=False)

    @app.task(name="load.inc", shared=False)
    def inc(x: int) -> int:
        return x + 1

    @pikku.workflow(name="load.three")
    def three(ctx: Context, x: int) -> Any:
        for i in range(STEPS):
            x = ctx.step(f"s{i}", inc, x)
        return x

    return LoadApp(app, pikku, inc, three)


def __getattr__(name: str) -> Any:
    """``app`` for the worker's ``-A``, built from ``PIKKU_LOAD_*`` once."""
    if name != "app":
        raise AttributeError(name)
    built = build(
        os.environ["PIKKU_LOAD_BROKER"],
        os.environ["PIKKU_LOAD_DB"],
        os.environ["PIKKU_LOAD_QUEUE"],
    )
    globals()["app"] = built.app
    return built.app
