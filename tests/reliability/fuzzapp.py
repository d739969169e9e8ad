"""The Celery app that the message-fuzz test's `celery worker` and `celery beat` load.

:func:`build` makes it from a settings mapping, so the test process and its
workers agree. Settings (all strings):

``PIKKU_FUZZ_BROKER``      broker URL (Redis)
``PIKKU_FUZZ_DATABASE``    the store's URL (migrated before any worker starts)
``PIKKU_FUZZ_QUEUE``       queue-name prefix, unique per test
``PIKKU_FUZZ_VISIBILITY``  broker visibility timeout = step lease (seconds)
``PIKKU_FUZZ_SWEEP``       beat sweep interval (seconds)

Workers load the module-level ``app``, built from their environment.

The workflow ``fuzz.chain`` runs four steps whose results all depend on the
run's input (and on the step before), so every run's output is its own:
:func:`expected` says what run ``i`` must end with. The ``tag`` step goes to a
second queue, so step messages travel on two queues. Every body logs the id
of the message that ran it (:data:`BODY_MARK`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku, Workflow

WORKFLOW = "fuzz.chain"
STEP_NAMES = ("add", "mul", "tag", "last")
TASKS = ("fuzz.add", "fuzz.mul", "fuzz.tag")
WORK_SECONDS = 0.08  # each body's work: long enough that messages queue up behind it
BODY_MARK = "fuzz body"
"""Each body run logs ``fuzz body <attempt task id> ran from message <run-step task id>``."""

log = logging.getLogger(__name__)


@dataclass
class FuzzApp:
    app: Celery
    pikku: Pikku
    step_queue: str  # the default queue: add, mul, last, and pikku.orchestrate
    tag_queue: str  # the tag step's queue
    workflow: Workflow

    @property
    def queues(self) -> list[str]:
        return [self.step_queue, self.tag_queue]


def expected_steps(i: int) -> dict[str, Any]:
    """Each step's result in run ``i``."""
    a = i + 7
    b = a * (i + 2)
    c = f"w{i}:{b}"
    d = b + len(c)
    return {"add": a, "mul": b, "tag": c, "last": d}


def expected(i: int) -> dict[str, Any]:
    """The output of run ``i`` (its input is ``{"i": i, "word": f"w{i}"}``)."""
    return {"i": i, **expected_steps(i)}


def build(env: Mapping[str, str]) -> FuzzApp:
    broker = env["PIKKU_FUZZ_BROKER"]
    database = env["PIKKU_FUZZ_DATABASE"]
    prefix = env.get("PIKKU_FUZZ_QUEUE", "pikku-fuzz")
    visibility = float(env.get("PIKKU_FUZZ_VISIBILITY", "5"))
    sweep = float(env.get("PIKKU_FUZZ_SWEEP", "1"))
    step_queue, tag_queue = f"{prefix}-celery", f"{prefix}-tags"

    app = Celery("pikku_fuzz", broker=broker, set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "visibility_timeout": visibility,
            "polling_interval": 0.05,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        task_default_queue=step_queue,
        task_routes={"fuzz.tag": {"queue": tag_queue}},
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    pikku = Pikku(
        app,
        database,
        sweep_interval=sweep,
        sweep_backoff=0.5,
        sweep_lease_ttl=2.0,
        message_grace=3.0,
        idle_after=3.0,
    )

    def work(request: Any) -> None:
        # Which message ran this body: pikku runs it under the run-step
        # message's request, whose task id is the body's parent id. The test
        # knows the ids of the messages it forged.
        log.info("%s %s ran from message %s", BODY_MARK, request.id, request.parent_id)
        time.sleep(WORK_SECONDS)  # the work itself, not synchronisation

    @app.task(name="fuzz.add", bind=True, shared=False)  # type: ignore[untyped-decorator]
    def add(self: Any, x: int, y: int) -> int:
        work(self.request)
        return x + y

    @app.task(name="fuzz.mul", bind=True, shared=False)  # type: ignore[untyped-decorator]
    def mul(self: Any, x: int, y: int) -> int:
        work(self.request)
        return x * y

    @app.task(name="fuzz.tag", bind=True, shared=False)  # type: ignore[untyped-decorator]
    def tag(self: Any, word: str, n: int) -> str:
        work(self.request)
        return f"{word}:{n}"

    @pikku.workflow(name=WORKFLOW)
    def chain(ctx: Context, job: dict[str, Any]) -> Any:
        i, word = job["i"], job["word"]
        a = ctx.step("add", add, i, 7, retries=2)
        b = ctx.step("mul", mul, a, i + 2, retries=2)
        c = ctx.step("tag", tag, word, b, retries=2)
        d = ctx.step("last", add, b, len(c), retries=2)
        return {"i": i, "add": a, "mul": b, "tag": c, "last": d}

    return FuzzApp(app, pikku, step_queue, tag_queue, chain)


def _log_to_stderr() -> None:
    """pikku's own log lines (refused messages, sweeps) and the bodies' marks
    into the worker's log file."""
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s: %(levelname)s/%(process)d] %(name)s: %(message)s")
    )
    for name in ("pikku_celery", __name__):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


if os.environ.get("PIKKU_FUZZ_BROKER"):
    _log_to_stderr()
    _built = build(os.environ)
    app = _built.app
