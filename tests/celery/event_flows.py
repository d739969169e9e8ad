"""The progress-events workflow of the real-worker events test
(``PIKKU_T_EXTRA=tests.celery.event_flows``; see :mod:`tests.celery.realapp`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))

    @app.task(name="t.events.chunk", shared=False)
    def chunk(key: str, i: int, hang_at: list[int], seconds: float) -> int:
        """One chunk of work; the first attempt of each chunk in ``hang_at``
        marks its pid (``<key>-<i>.pid``) and hangs until its worker is killed."""
        if i in hang_at:
            mark = marks / f"{key}-{i}.pid"
            if not mark.exists():
                mark.write_text(str(os.getpid()))
                threading.Event().wait(600)
        time.sleep(seconds)  # the work itself, not synchronisation
        return i

    @pikku.workflow(name="t.events.progress")
    def progress(ctx: Context, job: dict[str, Any]) -> int:
        n = job["chunks"]
        ctx.set_event("stage", "started")
        for i in range(n):
            ctx.step(f"chunk-{i}", chunk, job["key"], i, job["hang_at"], job["seconds"], retries=2)
            ctx.set_event("progress", {"done": i + 1, "of": n})
        ctx.set_event("stage", "finished")
        return n
