"""The Celery app that real `celery worker` subprocesses load in the tests.

:func:`build` makes the app from a settings mapping, so the test process and
its workers agree: ``PIKKU_T_BROKER``, ``PIKKU_T_DATABASE``, ``PIKKU_T_QUEUE``
(a per-session queue-name prefix), ``PIKKU_T_VISIBILITY``, ``PIKKU_T_SWEEP``
(seconds), ``PIKKU_T_MARKS`` (a folder for pid marks), ``PIKKU_T_METRICS``
(``1``: the worker-side Prometheus metrics), ``PIKKU_T_FLOW_CODE`` (the
code of :mod:`.versioned_flows` it runs), ``PIKKU_T_EXTRA`` (modules whose
``install(app, pikku, env)`` adds a test's own tasks), ``PIKKU_T_KEYPREFIX``
(a Redis broker node's key prefix) and ``PIKKU_T_POOLER`` (``Pikku(pooler=...)``:
the database URL goes through PgBouncer). Workers load the
module-level ``app``, built from their environment.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from celery import Celery

from pikku_celery import Context, Pikku, Workflow, step_connection, transactional

from . import shop, versioned_flows

ledger = sa.Table(
    "test_ledger",
    sa.MetaData(),
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(100), nullable=False),
    sa.Column("pid", sa.Integer(), nullable=False),
)

side_effects = sa.Table(
    "test_side_effect",
    sa.MetaData(),
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("n", sa.Integer(), nullable=False),
)


@dataclass
class TestApp:
    app: Celery
    pikku: Pikku
    queues: list[str]
    workflows: dict[str, Workflow]


def build(env: Mapping[str, str], **pikku_options: Any) -> TestApp:
    broker = env.get("PIKKU_T_BROKER", "memory://")
    database = env.get("PIKKU_T_DATABASE", "sqlite://")
    prefix = env.get("PIKKU_T_QUEUE", "pikku-test")
    visibility = float(env.get("PIKKU_T_VISIBILITY", "3"))
    sweep = float(env.get("PIKKU_T_SWEEP", "1"))
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))
    default_queue, shipping_queue = f"{prefix}-celery", f"{prefix}-shipping"

    app = Celery("pikku_test", broker=broker, set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "visibility_timeout": visibility,
            "polling_interval": 0.05,
            # Redis: look for unacked messages past their visibility every
            # second (kombu's default is ~100 s), so redelivery happens in
            # the test's time frame.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            **(
                {"global_keyprefix": env["PIKKU_T_KEYPREFIX"]}
                if env.get("PIKKU_T_KEYPREFIX")
                else {}
            ),
        },
        task_default_queue=default_queue,
        task_routes={"shop.label": {"queue": shipping_queue}},
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    amqp = broker.startswith("amqp")
    if env.get("PIKKU_T_POOLER"):
        pikku_options.setdefault("pooler", env["PIKKU_T_POOLER"])
    pikku = Pikku(
        app,
        database,
        sweep_interval=sweep,
        sweep_backoff=0.5,
        # A worker SIGKILLed mid-sweep holds the sweep lease until it lapses:
        # keep that shorter than the takeover bound the tests assert.
        sweep_lease_ttl=1.0,
        message_grace=3.0,
        idle_after=3.0,
        queue_leases={default_queue: visibility, shipping_queue: visibility} if amqp else None,
        metrics=env.get("PIKKU_T_METRICS") == "1",
        **pikku_options,
    )
    order = shop.install(app, pikku)
    versioned_flows.install(app, pikku, env.get("PIKKU_T_FLOW_CODE", "old"))
    app.conf.task_routes = {"shop.label": {"queue": shipping_queue}}
    for module in filter(None, env.get("PIKKU_T_EXTRA", "").split(",")):
        # More tasks for one test module's workers (``install(app, pikku, env)``).
        importlib.import_module(module).install(app, pikku, env)

    def bump(name: str) -> None:
        """Count an execution of a body in the database (survives worker kills)."""
        engine = pikku.sql_engine
        assert engine is not None
        with engine.begin() as conn:
            changed = conn.execute(
                side_effects.update()
                .where(side_effects.c.name == name)
                .values(n=side_effects.c.n + 1)
            ).rowcount
            if not changed:
                conn.execute(side_effects.insert().values(name=name, n=1))

    @app.task(name="t.hang_first", shared=False)
    def hang_first(key: str) -> str:
        """Attempt 1 marks its pid and hangs until killed; later attempts return."""
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return f"done {key}"

    @app.task(name="t.slow_once", shared=False)
    def slow_once(key: str, seconds: float) -> str:
        """Counts each execution, then outlives the visibility timeout."""
        bump(key)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the work itself, not synchronisation
        return key

    @transactional
    @app.task(name="t.ledger_hang_first", shared=False)
    def ledger_hang_first(key: str) -> str:
        """Writes its ledger row in the step's transaction; attempt 1 then hangs."""
        step_connection().execute(ledger.insert().values(key=key, pid=os.getpid()))
        mark = marks / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return f"booked {key}"

    @app.task(name="t.quick", shared=False)
    def quick(i: int) -> int:
        return i * 2

    @pikku.workflow(name="t.takeover")
    def takeover(ctx: Context, key: str) -> Any:
        return ctx.step("hang", hang_first, key, retries=2)

    @pikku.workflow(name="t.ledger")
    def ledger_run(ctx: Context, key: str) -> Any:
        return ctx.step("book", ledger_hang_first, key, retries=2)

    @pikku.workflow(name="t.slow")
    def slow(ctx: Context, job: dict[str, Any]) -> Any:
        return ctx.step("slow", slow_once, job["key"], job["seconds"])

    @pikku.workflow(name="t.five")
    def five(ctx: Context, i: int) -> Any:
        total = 0
        for k in range(5):
            total += ctx.step(f"s{k}", quick, i + k)
        ctx.sleep("nap", 0.2)
        return total

    return TestApp(
        app,
        pikku,
        [default_queue, shipping_queue],
        {
            "order": order,
            "takeover": takeover,
            "slow": slow,
            "five": five,
            "ledger": ledger_run,
        },
    )


if os.environ.get("PIKKU_T_BROKER"):
    _built = build(os.environ)
    app = _built.app
    pikku = _built.pikku  # what pikku-celery -A tests.celery.realapp finds
