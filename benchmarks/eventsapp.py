"""The Celery app the events benchmark's worker runs (settings from env, as
:mod:`benchmarks.benchapp`): one N-step workflow without events, the same
with a progress event set after each step."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku

BROKER = os.environ.get("PIKKU_BENCH_BROKER", "redis://127.0.0.1:6379/12")
DATABASE = os.environ.get("PIKKU_BENCH_DB", "sqlite:///bench.db")
QUEUE = os.environ.get("PIKKU_BENCH_QUEUE", "pikku-bench")

app = Celery("bench_events", broker=BROKER, backend=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    broker_transport_options={"visibility_timeout": 300},
    worker_prefetch_multiplier=1,
    result_expires=300,
    broker_connection_retry_on_startup=True,
)
pikku = Pikku(app, DATABASE, install_beat=False)


@app.task(name="bench.events.inc", shared=False)
def inc(x: int) -> int:
    return x + 1


@pikku.workflow(name="bench.events.plain")
def plain(ctx: Context, n: int) -> Any:
    x = 0
    for i in range(n):
        x = ctx.step(f"s{i}", inc, x)
    return x


@pikku.workflow(name="bench.events.progress")
def progress(ctx: Context, n: int) -> Any:
    x = 0
    for i in range(n):
        x = ctx.step(f"s{i}", inc, x)
        ctx.set_event("progress", {"done": i + 1, "of": n})
    return x
