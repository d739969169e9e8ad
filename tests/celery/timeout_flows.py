"""Workflows for the timeouts' real-worker tests (``PIKKU_T_EXTRA``).

Each first attempt of a hanging task hangs in a plain ``while True:
time.sleep(1)`` loop (the case the issue names) and leaves a mark in
``PIKKU_T_MARKS``; later attempts return at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from pikku_celery import Context, Pikku


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    """Register the tasks and workflows on the test app."""
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))

    def first_attempt(key: str) -> bool:
        mark = marks / f"{key}.first"
        if mark.exists():
            return False
        mark.write_text("1")
        return True

    @app.task(name="to.add", shared=False)
    def add(x: int) -> int:
        return x + 1

    @app.task(name="to.hang_first", shared=False)
    def hang_first(key: str) -> str:
        if first_attempt(key):
            while True:
                time.sleep(1)
        return f"second {key}"

    @app.task(name="to.block_first", shared=False)
    def block_first(key: str) -> str:
        if first_attempt(key):
            threading.Event().wait(600)  # blocked in C: no interrupt reaches it
        return f"second {key}"

    @app.task(name="to.limited_hang_first", shared=False, time_limit=2)
    def limited_hang_first(key: str) -> str:
        if first_attempt(key):
            while True:
                time.sleep(1)
        return f"second {key}"

    @app.task(name="to.soft_limited", shared=False, soft_time_limit=1, time_limit=30)
    def soft_limited(key: str) -> str:
        try:
            while True:
                time.sleep(1)
        except SoftTimeLimitExceeded:
            return f"cleaned up {key}"

    @app.task(name="to.hang", shared=False)
    def hang(key: str) -> str:
        (marks / f"{key}.started").write_text("1")
        while True:
            time.sleep(1)

    @pikku.workflow(name="to.step_timeout")
    def step_timeout(ctx: Context, key: str) -> Any:
        x = ctx.step("first", add, 0)  # a message; the next step runs eagerly after it
        return [x, ctx.step("hung", hang_first, key, retries=1, retry_delay=0, timeout=3)]

    @pikku.workflow(name="to.blocked")
    def blocked(ctx: Context, key: str) -> Any:
        x = ctx.step("first", add, 0)
        return [x, ctx.step("blocked", block_first, key, retries=1, retry_delay=0, timeout=2)]

    @pikku.workflow(name="to.task_limits")
    def task_limits(ctx: Context, key: str) -> Any:
        x = ctx.step("first", add, 0)  # a message; the next two run eagerly after it
        soft = ctx.step("soft", soft_limited, key)
        return [x, soft, ctx.step("hard", limited_hang_first, key, retries=1, retry_delay=0)]

    @pikku.workflow(name="to.child")
    def child(ctx: Context, key: str) -> Any:
        return ctx.step("kid-step", hang, f"{key}-kid")

    @pikku.workflow(name="to.deadline")
    def deadline(ctx: Context, key: str) -> Any:
        kid = ctx.child_async("kid", child, key)
        slow = ctx.step_async("slow", hang, f"{key}-slow")
        return ctx.gather(kid, slow)
