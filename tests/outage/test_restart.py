"""A PostgreSQL restart under a real ``celery worker``: the run goes on at once.

The store is a throwaway PostgreSQL of this module's own (the shared server
is never restarted), the broker a Redis key prefix of its own. While the
server restarts (``-m fast``: a clean stop; ``-m immediate``: a crash), one
run's broker step is running and ends, so its outcome is written across the
restart, and the next step's message goes out after it; another run's step
message is delivered during the outage (its queue gets a consumer then), so
its claim meets the outage. No beat runs: a lost message would stay lost.
``wait()`` is called on both runs before the restart and returns their output.

The delay the restart adds is measured from the restart's end (the server
accepts connections again) to the runs' end, beside the same runs with no
restart, and must stay under 10 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from pikku_celery.store.migrate import upgrade
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.celery import realapp
from tests.celery.workers import CeleryProcess, worker
from tests.helpers import wait_until
from tests.services import REDIS_URL, SESSION_TAG, unavailable
from tests.throwaway import ThrowawayPostgres

from .restartapp import late_queue

BOUND = 10.0
"""The most a restart may delay a run (issue 27, "Must show" 4)."""
LEASE = 30.0
"""The steps' lease (the queue's visibility timeout): longer than any
restart, so no step changes hands while the server is away."""
BROKER_REDIS_DB = 12

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    env: dict[str, str]
    app: realapp.TestApp
    worker: CeleryProcess
    marks: Path
    database: str


@pytest.fixture
def cluster(throwaway_pg: ThrowawayPostgres, tmp_path: Path) -> Iterator[Cluster]:
    database = throwaway_pg.database_url("pikku_restart")
    upgrade(database)
    broker = LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + f"/{BROKER_REDIS_DB}")
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable("redis", exc)
    env = {
        "PIKKU_T_BROKER": broker.url,
        "PIKKU_T_KEYPREFIX": broker.prefix,
        "PIKKU_T_DATABASE": database,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-restart",
        "PIKKU_T_VISIBILITY": str(LEASE),
        "PIKKU_T_SWEEP": "3600",
        "PIKKU_T_MARKS": str(tmp_path),
        "PIKKU_T_EXTRA": "tests.outage.restartapp",
    }
    app = realapp.build(env)
    node: CeleryProcess | None = None
    try:
        name = f"outage-{SESSION_TAG}"
        node = worker(env, app.queues, tmp_path / "worker.log", name, concurrency=2)
        node.wait_ready()
        yield Cluster(env, app, node, tmp_path, database)
    finally:
        if node is not None:
            node.kill()
        broker.teardown()
        assert app.pikku.sql_engine is not None
        app.pikku.sql_engine.dispose()


def answers(url: str) -> bool:
    """Whether the server takes a connection and a statement now."""
    conninfo = sa.make_url(url).set(drivername="postgresql").render_as_string(False)
    try:
        with psycopg.connect(conninfo, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class Waiter(threading.Thread):
    """``wait()`` on a run in a thread: its output and when it returned."""

    def __init__(self, handle: Any) -> None:
        super().__init__(daemon=True)
        self.handle = handle
        self.output: Any = None
        self.error: BaseException | None = None
        self.ended = 0.0

    def run(self) -> None:
        try:
            self.output = self.handle.wait(timeout=120)
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()


def runs_across(cluster: Cluster, server: ThrowawayPostgres, mode: str | None, key: str) -> float:
    """Both runs, the server restarted in ``mode`` (None: not at all) while
    they are in flight; the seconds from the restart's end (or, with no
    restart, from the moment the runs were let go) to the runs' end."""
    pikku, control = cluster.app.pikku, cluster.app.app.control
    host = [cluster.worker.hostname()]
    across = pikku.start("o.across", key)
    late = pikku.start("o.late", key)
    wait_until(lambda: (cluster.marks / f"{key}.started").exists(), timeout=30)
    waiters = [Waiter(across), Waiter(late)]
    for w in waiters:
        w.start()

    def let_go() -> None:
        (cluster.marks / f"{key}.go").write_text("")
        control.add_consumer(late_queue(cluster.env), destination=host, reply=True, timeout=5)

    if mode is None:
        began = time.monotonic()
        let_go()
    else:
        restart = threading.Thread(target=server.restart, args=(mode,))
        restart.start()
        wait_until(lambda: not answers(cluster.database), timeout=30, interval=0.005)
        let_go()  # while the server is down
        restart.join(120)
        began = time.monotonic()
    for w in waiters:
        w.join(120)
    control.cancel_consumer(late_queue(cluster.env), destination=host, reply=True, timeout=5)
    for w in waiters:
        assert w.error is None, f"{w.error!r}\n{cluster.worker.log()[-4000:]}"
    assert across.wait(timeout=1) == [f"held {key}", f"after {key}"]
    assert late.wait(timeout=1) == f"late {key}"
    return max(w.ended for w in waiters) - began


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_delays_a_run_in_flight_by_under_ten_seconds(
    cluster: Cluster, throwaway_pg: ThrowawayPostgres, mode: str
) -> None:
    quiet = runs_across(cluster, throwaway_pg, None, f"quiet-{mode}")
    restarted = runs_across(cluster, throwaway_pg, mode, f"restart-{mode}")
    log = cluster.worker.log()
    met = [
        what
        for what, line in (
            ("claim waited", "claiming step"),
            ("outcome retried", "while recording step outcome"),
            ("lost claim sent again", "its claim was lost"),
            ("message sent again", "the message is sent again"),
        )
        if line in log
    ]
    print(
        f"restart -m {mode}: runs ended {restarted:.2f} s after the restart's end "
        f"(no restart: {quiet:.2f} s after they were let go); added {restarted - quiet:.2f} s; "
        f"the worker: {', '.join(met) or 'met no outage'}"
    )
    assert restarted < BOUND, log[-4000:]
