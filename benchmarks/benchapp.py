"""The Celery app the workflow benchmark's worker runs (settings from env).

``PIKKU_BENCH_COUNT`` names a file: the worker then counts its round trips
to a MySQL/MariaDB store (each PyMySQL ``execute``, ``commit`` and
``rollback``: a batch of statements is one) and writes the count there when
it shuts down. ``PIKKU_BENCH_POOLER`` is ``Pikku(pooler=...)`` (the database
URL then goes through PgBouncer: ``benchmarks/capacity.py --pgbouncer``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
from typing import Any, cast

from celery import Celery, signals

from pikku_celery import Context, Pikku

BROKER = os.environ.get("PIKKU_BENCH_BROKER", "redis://127.0.0.1:6379/12")
DATABASE = os.environ.get("PIKKU_BENCH_DB", "sqlite:///bench.db")
QUEUE = os.environ.get("PIKKU_BENCH_QUEUE", "pikku-bench")
COUNT_FILE = os.environ.get("PIKKU_BENCH_COUNT")
POOLER = cast(Any, os.environ.get("PIKKU_BENCH_POOLER") or None)

app = Celery("bench", broker=BROKER, backend=BROKER, set_as_current=False)
app.conf.update(
    task_default_queue=QUEUE,
    broker_transport_options={"visibility_timeout": 300},
    worker_prefetch_multiplier=1,
    result_expires=300,
    broker_connection_retry_on_startup=True,
)
MAX_STEPS = int(os.environ.get("PIKKU_BENCH_MAX_STEPS", "1000"))  # workflow.py --steps 10000
pikku = Pikku(app, DATABASE, install_beat=False, pooler=POOLER, max_steps_per_run=MAX_STEPS)


@app.task(name="bench.inc", shared=False)
def inc(x: int) -> int:
    return x + 1


@pikku.workflow(name="bench.linear")
def linear(ctx: Context, n: int) -> Any:
    x = 0
    for i in range(n):
        x = ctx.step(f"s{i}", inc, x)
    return x


@pikku.workflow(name="bench.linear_broker", eager_steps=False)
def linear_broker(ctx: Context, n: int) -> Any:
    x = 0
    for i in range(n):
        x = ctx.step(f"s{i}", inc, x)
    return x


if COUNT_FILE:
    from tests.mysql_round_trips import counting

    # Counted for the worker's whole life (the stack kept, so the counting
    # stays on); written when it shuts down.
    _counting = contextlib.ExitStack()
    round_trips = _counting.enter_context(counting())

    def _write_count(**_: Any) -> None:
        with open(COUNT_FILE, "w") as out:
            out.write(str(round_trips[0]))

    # Reset once the worker is up: what it ran at start-up is not a step's.
    signals.worker_ready.connect(lambda **_: round_trips.__setitem__(0, 0), weak=False)
    signals.worker_shutdown.connect(_write_count, weak=False)
    atexit.register(_write_count)
