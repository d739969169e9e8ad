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
from celery import Celery, chain, group
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_received

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

    @app.task(name="c.replace_with_chain", bind=True, shared=False)
    def replace_with_chain(self: Any, x: int) -> Any:
        """Replaces itself (``self.replace``) with ``add(x, 1) | mul(10)``."""
        return self.replace(chain(add.s(x, 1), mul.s(10)))

    @app.task(name="c.replace_with_group", bind=True, shared=False)
    def replace_with_group(self: Any, x: int) -> Any:
        """Replaces itself with ``group(add(x, 1), add(x, 2))``."""
        return self.replace(group(add.s(x, 1), add.s(x, 2)))

    @app.task(name="c.replace_with_boom", bind=True, shared=False)
    def replace_with_boom(self: Any, x: Any) -> Any:
        """Replaces itself with a task that fails."""
        return self.replace(boom.si(x))

    @app.task(name="c.replace_with_hang", bind=True, shared=False)
    def replace_with_hang(self: Any, value: Any, key: str) -> Any:
        """Counts its runs, then replaces itself with ``hang_first | ledger``."""
        push(f"{key}:replaced", value)
        return self.replace(chain(hang_first.si(value, key), ledger.s(key)))

    @pikku.workflow(name="c.replacing_workflow")
    def replacing_workflow(ctx: Any, x: int) -> Any:
        """A workflow whose step's task replaces itself."""
        replaced = ctx.step("replaced", "c.replace_with_chain", x)
        grouped = ctx.step("grouped", "c.replace_with_group", x)
        return {"replaced": replaced, "grouped": grouped, "after": ctx.step("after", add, 1, 1)}

    @app.task(name="c.type_names", shared=False)
    def type_names(*values: Any) -> list[str]:
        """The type of each argument, as the task received it."""
        return [type(v).__name__ for v in values]

    @app.task(name="c.own_id", bind=True, shared=False)
    def own_id(self: Any, *_: Any) -> str:
        """The id the task sees as ``self.request.id``."""
        return str(self.request.id)

    @app.task(name="c.record_errback_id", shared=False)
    def record_errback_id(request: Any, exc: BaseException, traceback: Any, tag: str) -> None:
        """A new-style errback that records the failed request's id."""
        push(tag, request.id)

    @app.task(name="c.own_priority", bind=True, shared=False)
    def own_priority(self: Any, *_: Any) -> Any:
        """The priority the task's request says it was delivered with."""
        return (self.request.delivery_info or {}).get("priority")

    @app.task(name="c.fail_with_args", shared=False)
    def fail_with_args(*values: Any) -> None:
        """Raises an exception made with several arguments."""
        raise ValueError("Task expected to fail", *values)

    @app.task(name="c.adds_to_chord", bind=True, shared=False)
    def adds_to_chord(self: Any, nums: list[int], val: int) -> int:
        """Adds ``add(num, val)`` to its chord for each num (``self.add_to_chord``)."""
        for num in nums:
            self.add_to_chord(add.s(num, val))
        return 0

    @app.task(name="c.adds_chord_to_chord", bind=True, shared=False)
    def adds_chord_to_chord(self: Any, nums: list[int], val: int) -> int:
        """Adds ``group(add(num, val) ...) | tsum`` to its chord."""
        self.add_to_chord(group([add.s(num, val) for num in nums]) | tsum.s())
        return 0

    @app.task(name="c.soft_guarded", shared=False)
    def soft_guarded(value: int) -> int:
        """Waits for its soft time limit and returns 0 when it comes (else ``value``)."""
        try:
            threading.Event().wait(10)
        except SoftTimeLimitExceeded:
            return 0
        return value

    @app.task(name="c.own_eta", bind=True, shared=False)
    def own_eta(self: Any, *_: Any) -> Any:
        """The ``eta`` the task's request says it was due at (None: not delayed)."""
        return self.request.eta

    @app.task(name="c.slow", shared=False)
    def slow(value: Any, seconds: float) -> Any:
        """Returns ``value`` after ``seconds`` (an errback that takes its time)."""
        threading.Event().wait(seconds)
        return value

    @app.task(name="c.lineage", bind=True, shared=False)
    def lineage(self: Any, label: str, tag: str) -> str:
        """Records ``[label, id, root_id, parent_id]`` of its request."""
        request = self.request
        push(tag, [label, request.id, request.root_id, request.parent_id])
        return label

    @app.task(name="c.stamps_seen", bind=True, shared=False)
    def stamps_seen(self: Any, *_: Any) -> dict[str, Any]:
        """The stamps its request carries (Celery's stamping API)."""
        names = sorted(self.request.stamped_headers or [])
        stamps = self.request.stamps or {}
        return {"stamped_headers": names, "stamps": {n: stamps.get(n) for n in names}}

    @task_received.connect(weak=False)
    def record_received_stamps(request: Any = None, **_: Any) -> None:
        """A message's stamps as the worker received them, under the tag its
        ``tag`` stamp names (what a ``task_received`` handler sees)."""
        stamps = dict(getattr(request, "stamps", None) or {})
        if isinstance(stamps.get("tag"), str):
            push(f"received:{stamps['tag']}", stamps)

    @app.task(name="c.replace_with_lineage", bind=True, shared=False)
    def replace_with_lineage(self: Any, tag: str) -> Any:
        """Records its lineage as ``t``, then replaces itself with two that do."""
        request = self.request
        push(tag, ["t", request.id, request.root_id, request.parent_id])
        return self.replace(chain(lineage.si("r1", tag), lineage.si("r2", tag)))
