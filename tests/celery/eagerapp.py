"""The Celery app of the eager-step tests on real workers.

:func:`build` adds the eager-step workflows to :func:`realapp.build`'s app
(same settings, same environment variables), plus ``PIKKU_T_EAGER_MAX``
(the eager step budget) and ``PIKKU_T_OTHER`` (a queue name only a second
worker consumes). Bodies that must be seen from outside without touching
the store (the commit count) leave files in ``PIKKU_T_MARKS``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pikku_celery import Context, step_connection, transactional

from . import realapp


def build(env: Mapping[str, str]) -> realapp.TestApp:
    max_steps = env.get("PIKKU_T_EAGER_MAX")
    t = realapp.build(env, **({"eager_max_steps": int(max_steps)} if max_steps else {}))
    app, pikku = t.app, t.pikku
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))
    other = env.get("PIKKU_T_OTHER", f"{t.queues[0]}-other")

    @app.task(name="e.add", shared=False)
    def add(x: int) -> int:
        return x + 1

    @app.task(name="e.mark_done", shared=False)
    def mark_done(key: str, x: int) -> int:
        (marks / f"{key}.done").write_text(str(x))
        return x

    app.conf.task_routes = {**app.conf.task_routes, "e.elsewhere": {"queue": other}}

    @app.task(name="e.elsewhere", shared=False)
    def elsewhere(x: int) -> int:
        return x + 1

    @app.task(name="e.limited", shared=False, rate_limit="1000/s")
    def limited(x: int) -> int:
        return x + 1

    @app.task(name="e.timed", shared=False, time_limit=30)
    def timed(x: int) -> int:
        return x + 1

    @app.task(name="e.fails_once", shared=False)
    def fails_once(key: str, x: int) -> int:
        mark = marks / f"{key}.failed"
        if not mark.exists():
            mark.write_text("1")
            raise RuntimeError("the first attempt fails")
        return x + 1

    @app.task(name="e.slow_add", shared=False)
    def slow_add(x: int, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.02)  # the work itself, not synchronisation
        return x + 1

    @app.task(name="e.hang_first", shared=False)
    def hang_first(key: str, x: int) -> int:
        """Attempt 1 marks its pid and hangs until killed; later attempts return."""
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return x + 1

    @transactional
    @app.task(name="e.ledger_stall_first", shared=False)
    def ledger_stall_first(key: str, x: int) -> int:
        """Writes its ledger row in the step's transaction; attempt 1 marks
        its pid and then works for a long while (stopped and resumed)."""
        step_connection().execute(realapp.ledger.insert().values(key=key, pid=os.getpid()))
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            deadline = time.monotonic() + 8.0
            while time.monotonic() < deadline:
                time.sleep(0.02)  # the work itself, not synchronisation
            return -1
        return x + 1

    @transactional
    @app.task(name="e.ledger_add", shared=False)
    def ledger_add(key: str, x: int) -> int:
        step_connection().execute(realapp.ledger.insert().values(key=key, pid=os.getpid()))
        return x + 1

    @pikku.workflow(name="e.ten")
    def ten(ctx: Context, key: str) -> int:
        x = 0
        for i in range(9):
            x = ctx.step(f"s{i}", add, x)
        return int(ctx.step("s9", mark_done, key, x + 1))

    @pikku.workflow(name="e.mixed")
    def mixed(ctx: Context, key: str) -> list[int]:
        x = ctx.step("a", add, 0)
        x = ctx.step("other-queue", elsewhere, x)
        x = ctx.step("rate-limited", limited, x)
        x = ctx.step("time-limited", timed, x)
        x = ctx.step("retried", fails_once, key, x, retries=1, retry_delay=0)
        x = ctx.step("after", add, x)
        branches = [ctx.step_async(f"branch{i}", add, x + i) for i in range(3)]
        return list(ctx.gather(*branches))

    @pikku.workflow(name="e.slow_chain")
    def slow_chain(ctx: Context, job: dict[str, Any]) -> int:
        x = 0
        for i in range(job["steps"]):
            x = ctx.step(f"s{i}", slow_add, x, job["seconds"])
        return x

    @pikku.workflow(name="e.kill_mid")
    def kill_mid(ctx: Context, key: str) -> int:
        x = ctx.step("a", ledger_add, f"{key}:a", 0)
        x = ctx.step("b", hang_first, key, x, retries=2)
        return int(ctx.step("c", ledger_add, f"{key}:c", x))

    @pikku.workflow(name="e.stop_mid")
    def stop_mid(ctx: Context, key: str) -> int:
        x = ctx.step("a", add, 0)
        x = ctx.step("b", ledger_stall_first, key, x, retries=2)
        return int(ctx.step("c", add, x))

    @pikku.workflow(name="e.ledger_five")
    def ledger_five(ctx: Context, key: str) -> int:
        x = 0
        for i in range(5):
            # Attempts to spare: a restart longer than the test's 3-s lease
            # lapses the lease of a step whose worker waits out the outage.
            x = ctx.step(f"s{i}", ledger_add, f"{key}:{i}", x, retries=2)
        return x

    t.workflows.update(
        {
            "ledger_five": ledger_five,
            "ten": ten,
            "mixed": mixed,
            "slow_chain": slow_chain,
            "kill_mid": kill_mid,
            "stop_mid": stop_mid,
        }
    )
    t.queues.append(other)
    return t


if os.environ.get("PIKKU_T_BROKER"):
    _built = build(os.environ)
    app = _built.app
