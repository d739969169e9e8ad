"""Workflows for the concurrency real-worker tests (``PIKKU_T_EXTRA``): one step
each, limited to one running run per key."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import Concurrency, Context, Pikku


def by_key(job: dict[str, Any]) -> str:
    return str(job["key"])


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    """Register the tasks and workflows on the test app."""
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))

    @app.task(name="cc.work", shared=False)
    def work(seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)  # the work itself, not synchronisation
        return os.getpid()

    @app.task(name="cc.hang_first", shared=False)
    def hang_first(mark: str) -> str:
        """Attempt 1 marks its pid and hangs until killed; later attempts return."""
        path = marks / f"{mark}.pid"
        if not path.exists():
            path.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return mark

    @pikku.workflow(name="cc.queue", concurrency=Concurrency(key=by_key, limit=1))
    def queued(ctx: Context, job: dict[str, Any]) -> Any:
        if job.get("gate"):
            ctx.wait_for_signal("go")  # holds the key until the test lets go
        return ctx.step("work", work, job["seconds"], eager=False)

    @pikku.workflow(
        name="cc.latest",
        concurrency=Concurrency(key=by_key, limit=1, on_limit="cancel_in_progress"),
    )
    def latest(ctx: Context, job: dict[str, Any]) -> Any:
        if job.get("gate"):
            ctx.wait_for_signal("go")
        return ctx.step("work", work, job["seconds"], eager=False)

    @pikku.workflow(name="cc.hang", concurrency=Concurrency(key=by_key, limit=1))
    def hang(ctx: Context, job: dict[str, Any]) -> Any:
        return ctx.step("hang", hang_first, job["mark"], retries=2)

    @pikku.workflow(name="cc.three", concurrency=Concurrency(key=by_key, limit=3))
    def three(ctx: Context, job: dict[str, Any]) -> Any:
        return ctx.step("work", work, job["seconds"], eager=False)
