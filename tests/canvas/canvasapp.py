"""Canvas tasks for the real-worker tests, installed into ``tests.celery.realapp``.

``realapp.build`` calls :func:`install` when ``PIKKU_T_EXTRA`` names this
module. The same tasks serve plain Celery canvas (with the Redis result
backend of ``PIKKU_T_BACKEND``) and durable canvas. What a task observes (a
link's value, an errback's arguments, an attempt) is pushed onto a Redis list
under ``PIKKU_T_RECORDS`` + tag, so a test compares side effects, not only
results. Each execution of a ``ledger`` task adds a row to ``test_ledger``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from pikku_celery import Pikku, step_connection, transactional

from ..celery import realapp


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    backend = env.get("PIKKU_T_BACKEND")
    if backend:
        app.conf.result_backend = backend
    records = env.get("PIKKU_T_RECORDS", "pikku-canvas-records")
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))
    client = redis.Redis.from_url(env.get("PIKKU_T_RECORDS_REDIS", "redis://127.0.0.1:6379/0"))

    def push(tag: str, value: Any) -> None:
        client.rpush(f"{records}:{tag}", json.dumps(value))

    @app.task(name="c.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="c.mul", shared=False)
    def mul(x: int, y: int) -> int:
        return x * y

    @app.task(name="c.tsum", shared=False)
    def tsum(values: list[int], *extra: int) -> int:
        return sum(values) + sum(extra)

    @app.task(name="c.collect", shared=False)
    def collect(*values: Any, **named: Any) -> dict[str, Any]:
        return {"args": list(values), "kwargs": named}

    @app.task(name="c.boom", shared=False)
    def boom(*values: Any) -> None:
        raise ValueError(f"boom {values!r}")

    @app.task(name="c.missing", shared=False)
    def missing(key: str) -> None:
        raise KeyError(key)

    @app.task(name="c.record", shared=False)
    def record(value: Any, tag: str) -> Any:
        """A link: records the value it was called with."""
        push(tag, value)
        return value

    @app.task(name="c.record_new_errback", shared=False)
    def record_new_errback(request: Any, exc: BaseException, traceback: Any, tag: str) -> None:
        """A new-style errback: Celery calls it ``(request, exc, traceback)``."""
        push(
            tag,
            {
                "task": request.task,
                "args": list(request.args or []),
                "exc": repr(exc),
                "traceback": bool(traceback),
            },
        )

    @app.task(name="c.raising_errback", shared=False)
    def raising_errback(request: Any, exc: BaseException, traceback: Any, tag: str) -> None:
        """A new-style errback that records its call, then raises (Celery logs it)."""
        push(tag, {"called_for": request.task})
        raise RuntimeError("the errback itself failed")

    @app.task(name="c.record_old_errback", shared=False)
    def record_old_errback(task_id: str, tag: str) -> None:
        """An old-style errback: Celery sends it the failed task's id."""
        push(tag, {"task_id_given": isinstance(task_id, str) and len(task_id) == 36})

    @app.task(
        name="c.flaky",
        shared=False,
        autoretry_for=(KeyError,),
        max_retries=3,
        default_retry_delay=0.2,
        retry_jitter=False,
    )
    def flaky(value: int, tag: str, failures: int) -> int:
        """Fails ``failures`` times (autoretry), then returns ``value``."""
        n = int(client.incr(f"{records}:{tag}:calls"))
        push(tag, n)
        if n <= failures:
            raise KeyError(f"attempt {n}")
        return value

    @transactional
    @app.task(name="c.ledger", shared=False)
    def ledger(value: Any, key: str) -> Any:
        """Writes a ledger row in the step's own transaction: one row per
        recorded success, whatever kills the worker."""
        step_connection().execute(realapp.ledger.insert().values(key=key, pid=os.getpid()))
        return value

    @app.task(name="c.hang_first", shared=False)
    def hang_first(value: Any, key: str) -> Any:
        """The first execution marks its pid and hangs until killed."""
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return value
