"""A worker whose clock is an hour fast cannot take a step another worker holds.

The fast worker is a separate process whose Python clock (``time.time``,
``time.time_ns``, ``datetime.now``) runs an hour ahead; it talks to the same
PostgreSQL database. Leases are granted and judged on the database's clock,
so its view of the time changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import sqlalchemy as sa

from pikku_celery.store import WorkflowStore
from pikku_celery.store.sql_for import store_for
from tests.store.conftest import wipe
from tests.store.support import LONG, TASK, claim, make_tasks

ROOT = Path(__file__).resolve().parents[2]

FAST_WORKER = textwrap.dedent(
    """
    import datetime as _dt, json, sys, time

    SKEW = 3600.0
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + SKEW
    time.time_ns = lambda: real_time_ns() + int(SKEW * 1e9)

    class FastDateTime(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return _dt.datetime.fromtimestamp(time.time(), tz)

        @classmethod
        def utcnow(cls):
            return _dt.datetime.fromtimestamp(time.time(), _dt.UTC).replace(tzinfo=None)

    _dt.datetime = FastDateTime

    from pikku_celery.sql.engines import make_engine
    from pikku_celery.store.sql_for import store_for

    url, held, free = sys.argv[1], sys.argv[2], sys.argv[3]
    store = store_for(make_engine(url))
    stolen = store.claim_step(held, "tasks.work", "fast-worker", 60_000)
    renewed = store.refresh_step_lease(held, 2, 60_000)
    expired = store.expire_step(held)
    mine = store.claim_step(free, "tasks.work", "fast-worker", 60_000)
    print(json.dumps({
        "python_now_ms": int(time.time() * 1000),
        "db_now_ms": store.now_ms(),
        "stolen": stolen is not None,
        "renewed": renewed,
        "expired": expired,
        "lapsed": [s.id for s in store.lapsed_steps(10)],
        "mine_lease": None if mine is None else mine.lease_expires_at,
    }))
    """
)


def test_an_hour_fast_worker_cannot_claim_a_held_step(store_pg_engine: sa.Engine) -> None:
    wipe(store_pg_engine)
    store: WorkflowStore = store_for(store_pg_engine)
    _, (held, free) = make_tasks(store, 2, max_attempts=3)
    holder = claim(store, held, "honest-worker", lease=LONG)
    url = store_pg_engine.url.render_as_string(hide_password=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", FAST_WORKER, url, held.id, free.id],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # the worker's clock really was an hour ahead of the database's
    assert seen["python_now_ms"] - seen["db_now_ms"] > 3_500_000
    assert seen["stolen"] is False
    assert seen["renewed"] is False  # nor can it forge attempt 2 of the step
    assert seen["expired"] is False
    assert seen["lapsed"] == []
    # its own claim's lease is on the database clock, not an hour out
    assert seen["mine_lease"] is not None
    assert seen["mine_lease"] - seen["db_now_ms"] <= 60_000
    assert store.get_step(held.id) == holder
    assert store.refresh_step_lease(held.id, holder.attempt, LONG) is True
    assert store.claim_step(held.id, TASK, "anyone", LONG) is None
