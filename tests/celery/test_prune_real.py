"""Prune beside a real ``celery worker`` (PIKKU_LONG=1): runs settle on the worker
while the test process prunes again and again, PostgreSQL store, Redis broker.

Each run (five steps and a timer) is pruned only once it settled: a prune
that took a run still going would leave its worker's next write failing
(logged as an error) and the run counted short. Every run started is pruned
exactly once, with all its steps, and the worker logs no error.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from pikku_celery.engine.prune import PruneReport
from pikku_celery.store.migrate import upgrade
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.helpers import long_form
from tests.services import PG_ADMIN_URL, REDIS_URL, SESSION_TAG, scratch_database, unavailable

from . import realapp
from .workers import worker

pytestmark = [
    pytest.mark.slow,
    long_form(
        "a real worker and prunes racing for a minute; "
        "the default run races threads in tests/store/test_prune_race.py"
    ),
]

RUNS = 200
STEPS = 6  # five task steps and a timer


def test_prune_beside_a_real_worker_takes_each_run_once_it_settled(tmp_path: Path) -> None:
    broker = LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + "/11")
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable("redis", exc)
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_prune_real") as url:
        upgrade(url)
        env = {
            "PIKKU_T_BROKER": broker.url,
            "PIKKU_T_KEYPREFIX": broker.prefix,
            "PIKKU_T_DATABASE": url,
            "PIKKU_T_QUEUE": f"{SESSION_TAG}-prune",
            "PIKKU_T_MARKS": str(tmp_path),
        }
        app = realapp.build(env, retention=timedelta(0))
        node = worker(env, app.queues, tmp_path / "w.log", f"prune-{SESSION_TAG}", 2)
        try:
            node.wait_ready()
            five = app.workflows["five"]
            for i in range(RUNS):
                five.start(i)
            total = PruneReport()
            taking = 0  # prunes that took runs while others were still going
            deadline = time.monotonic() + 180
            while total.counts.runs < RUNS and time.monotonic() < deadline:
                report = app.pikku.prune(time_budget=None)
                total.counts.add(report.counts)
                taking += 0 < total.counts.runs < RUNS
            log = node.log()
            assert total.counts.runs == RUNS, log[-4000:]
            assert total.counts.steps == RUNS * STEPS
            assert taking > 1  # it raced: runs went while others ran
            assert app.pikku.store.list_runs(limit=10) == []
            assert "ERROR" not in log and "Traceback" not in log, log[-4000:]
        finally:
            node.kill()
            broker.teardown()
            assert app.pikku.sql_engine is not None
            app.pikku.sql_engine.dispose()
