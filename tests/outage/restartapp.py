"""The restart test's own tasks and workflows, for real workers
(``PIKKU_T_EXTRA=tests.outage.restartapp`` on :mod:`tests.celery.realapp`).

``o.across``: a broker step that is running while the database restarts
(it holds until the test drops its ``<key>.go`` mark), then a broker step
sent after it. ``o.late``: one step on the queue ``<prefix>-late``, which no
worker consumes until the test adds a consumer while the database is down,
so that step's message is delivered, and claimed, during the outage.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku

HOLD_POLL = 0.01


def late_queue(env: Mapping[str, str]) -> str:
    return f"{env.get('PIKKU_T_QUEUE', 'pikku-test')}-late"


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))
    late = late_queue(env)

    @app.task(name="o.hold", shared=False)
    def hold(key: str) -> str:
        """Marks that it runs, then holds until the test's go mark appears."""
        (marks / f"{key}.started").write_text("")
        while not (marks / f"{key}.go").exists():
            time.sleep(HOLD_POLL)  # the step's own work: waiting on the outside world
        return f"held {key}"

    @app.task(name="o.echo", shared=False)
    def echo(value: str) -> str:
        return value

    @pikku.workflow(name="o.across")
    def across(ctx: Context, key: str) -> Any:
        held = ctx.step("hold", hold, key)
        after = ctx.step("after", echo, f"after {key}", eager=False)
        return [held, after]

    @pikku.workflow(name="o.late")
    def late_run(ctx: Context, key: str) -> Any:
        return ctx.step("late", echo, f"late {key}", queue=late)
