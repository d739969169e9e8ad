"""The Celery app that the chaos suite's `celery worker` and `celery beat` load.

:func:`build` makes it from a settings mapping, so the runner and its workers
agree. Settings (all strings):

``PIKKU_CHAOS_BROKER``      broker URL (Redis)
``PIKKU_CHAOS_KEYPREFIX``   the broker node's key prefix (flushed: the run's messages lost)
``PIKKU_CHAOS_DATABASE``    the store's URL; the ledger table lives there too
``PIKKU_CHAOS_QUEUE``       queue-name prefix, unique per chaos run
``PIKKU_CHAOS_COUNTER``     Redis URL of the non-transactional counters
``PIKKU_CHAOS_NS``          key namespace of this chaos run in that Redis
``PIKKU_CHAOS_VISIBILITY``  broker visibility timeout = step lease (seconds)
``PIKKU_CHAOS_SWEEP``       beat sweep interval (seconds)
``PIKKU_CHAOS_SKEWED``      "1" in a worker started under ``faketime``
``PIKKU_CHAOS_POOL_RECYCLE`` seconds after which a pooled store connection is replaced

Workers load the module-level ``app``, built from their environment.

Each of a run's five steps is ``chaos.step``: a transactional task that
appends its ledger row through :func:`pikku_celery.step_connection` (so the
row commits with the step's fenced outcome or not at all), counts its
execution in Redis outside any transaction, works for 10-300 ms and returns
its attempt number.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
import sqlalchemy as sa
from celery import Celery, signals

from pikku_celery import Context, Pikku, Workflow, step_connection, transactional
from pikku_celery.sql.engines import make_engine, now_ms_sql

STEPS = 5
STEP_RETRIES = 50  # kills, the restart and the flush each cost a step an attempt
WORKFLOW = "chaos.five"
STEP_TASK = "chaos.step"

ledger = sa.Table(
    "chaos_ledger",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(36), nullable=False),
    sa.Column("step", sa.String(32), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("worker", sa.String(255), nullable=False),  # host:pid, as attempt rows say
    # The worker's wall clock and the database's, both in epoch ms: a skewed
    # worker shows here an hour ahead of the store.
    sa.Column("worker_clock_ms", sa.BigInteger(), nullable=False),
    sa.Column(
        "db_clock_ms",
        sa.BigInteger(),
        nullable=False,
        server_default=sa.text(now_ms_sql("postgresql")),
    ),
)


def worker_name() -> str:
    """Who this process is in attempt rows (``WorkflowEngine.worker_id``)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def exec_key(ns: str, run_id: str, step: str) -> str:
    """The per-step execution counter (one ``INCR`` per body run)."""
    return f"{ns}:exec:{run_id}:{step}"


def attempt_runs_key(ns: str) -> str:
    """A hash ``run:step:attempt -> body runs``: an attempt must run at most once."""
    return f"{ns}:attempt-runs"


def procs_key(ns: str) -> str:
    """A hash ``host:pid -> {"skewed", "clock", "redis_clock"}`` of pool processes."""
    return f"{ns}:procs"


@dataclass
class ChaosApp:
    app: Celery
    pikku: Pikku
    queue: str
    workflow: Workflow
    ns: str

    def release(self) -> None:
        """Disconnect the pool-process marker from Celery's (process-wide)
        signal: a test process that built this app must not have a later
        test's in-process worker call it, with this run's Redis gone."""
        signals.worker_process_init.disconnect(dispatch_uid=mark_uid(self.ns))


def mark_uid(ns: str) -> str:
    """The dispatch uid of one chaos app's pool-process marker."""
    return f"pikku-chaos-mark-{ns}"


def build(env: Mapping[str, str]) -> ChaosApp:
    broker = env["PIKKU_CHAOS_BROKER"]
    database = env["PIKKU_CHAOS_DATABASE"]
    queue = f"{env.get('PIKKU_CHAOS_QUEUE', 'pikku-chaos')}-celery"
    counter_url = env["PIKKU_CHAOS_COUNTER"]
    ns = env["PIKKU_CHAOS_NS"]
    visibility = float(env.get("PIKKU_CHAOS_VISIBILITY", "3"))
    sweep = float(env.get("PIKKU_CHAOS_SWEEP", "1"))
    skewed = env.get("PIKKU_CHAOS_SKEWED") == "1"

    app = Celery("pikku_chaos", broker=broker, set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "visibility_timeout": visibility,
            "polling_interval": 0.05,
            # Look for unacked messages past their visibility every second
            # (kombu's default is ~100 s), so redelivery happens within the run.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            **(
                {"global_keyprefix": env["PIKKU_CHAOS_KEYPREFIX"]}
                if env.get("PIKKU_CHAOS_KEYPREFIX")
                else {}
            ),
        },
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    recycle = env.get("PIKKU_CHAOS_POOL_RECYCLE")  # seconds: connections turn over
    pikku = Pikku(
        app,
        engine=make_engine(database, pool_recycle=float(recycle)) if recycle else None,
        database_url=None if recycle else database,
        sweep_interval=sweep,
        sweep_backoff=0.5,
        message_grace=3.0,
        idle_after=3.0,
        # A worker SIGKILLed inside a pass or a sweep leaves its lease behind
        # until it lapses: keep those short, like the step leases.
        run_lease_ttl=5.0,
        sweep_lease_ttl=5.0,
    )
    counters: dict[int, redis.Redis] = {}

    def counter() -> redis.Redis:
        client = counters.get(os.getpid())
        if client is None:
            client = counters[os.getpid()] = redis.Redis.from_url(counter_url)
        return client

    @transactional
    @app.task(name=STEP_TASK, bind=True, shared=False)  # type: ignore[untyped-decorator]
    def chaos_step(self: Any, run_id: str, step: str) -> dict[str, Any]:
        attempt = int(self.request.retries) + 1
        # (a) the ledger row, in the step's own store transaction
        step_connection().execute(
            ledger.insert().values(
                run_id=run_id,
                step=step,
                attempt=attempt,
                worker=worker_name(),
                worker_clock_ms=int(time.time() * 1000),
            )
        )
        # (b) the non-transactional side effect, before the work
        pipe = counter().pipeline(transaction=False)
        pipe.incr(exec_key(ns, run_id, step))
        pipe.hincrby(attempt_runs_key(ns), f"{run_id}:{step}:{attempt}", 1)
        pipe.execute()
        # (c) the work itself
        time.sleep(random.uniform(0.01, 0.3))
        # (d) a result that says which attempt produced it
        return {"step": step, "attempt": attempt}

    @pikku.workflow(name=WORKFLOW)
    def five(ctx: Context, i: int) -> Any:
        results = [
            ctx.step(
                f"s{k}",
                chaos_step,
                ctx.run_id,
                f"s{k}",
                retries=STEP_RETRIES,
                retry_delay=0.25,
                backoff=1.0,
            )
            for k in range(STEPS)
        ]
        return {"i": i, "steps": results}

    def mark_process(**_: Any) -> None:
        """Record this pool process, its wall clock and Redis's, once per fork."""
        client = counter()
        seconds, micros = client.time()
        mark = {"skewed": skewed, "clock": time.time(), "redis_clock": seconds + micros / 1e6}
        client.hset(procs_key(ns), worker_name(), json.dumps(mark))

    signals.worker_process_init.connect(mark_process, weak=False, dispatch_uid=mark_uid(ns))
    return ChaosApp(app, pikku, queue, five, ns)


def _log_to_stderr() -> None:
    """pikku's own log lines (refused outcomes, sweeps) into the worker's log file."""
    handler = logging.StreamHandler(sys.__stderr__)
    handler.setFormatter(
        logging.Formatter("[%(asctime)s: %(levelname)s/%(process)d] %(name)s: %(message)s")
    )
    log = logging.getLogger("pikku_celery")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


if os.environ.get("PIKKU_CHAOS_BROKER"):
    _log_to_stderr()
    _built = build(os.environ)
    app = _built.app
