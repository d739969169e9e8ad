"""Workflows for the sweep's real-worker test (``PIKKU_T_EXTRA``): a fan-out
and a single step on a work queue, and a step on a queue no worker consumes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku


def queues(env: Mapping[str, str]) -> tuple[str, str]:
    """The work queue (served once the test starts its worker) and the queue
    no worker ever consumes."""
    prefix = env.get("PIKKU_T_QUEUE", "pikku-test")
    return f"{prefix}-work", f"{prefix}-nobody"


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    """Register the tasks and workflows on the test app."""
    work, nobody = queues(env)

    @app.task(name="sw.second", shared=False)
    def second(i: int) -> int:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the work itself, not synchronisation
        return i

    @app.task(name="sw.unserved", shared=False)
    def unserved() -> int:
        return 0

    @pikku.workflow(name="sw.fanout")
    def fanout(ctx: Context, n: int) -> Any:
        handles = [ctx.step_async(f"s{i}", second, i, queue=work) for i in range(n)]
        return sum(ctx.gather(*handles))

    @pikku.workflow(name="sw.one")
    def one(ctx: Context) -> Any:
        return ctx.step("only", second, 7, queue=work, retries=2)

    @pikku.workflow(name="sw.stuck")
    def stuck(ctx: Context) -> Any:
        return ctx.step("never", unserved, queue=nobody, retries=2)
