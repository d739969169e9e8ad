"""The sweep on real workers (issue 33, findings 3 and 4): a real ``celery
worker`` and ``celery beat`` (sweep every second), Redis broker, SQLite store.

Lost messages are lost for real: a queue no worker consumes, or the work
queue purged before its worker starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from pikku_celery.sql.schema import step_table
from tests.helpers import wait_until
from tests.services import SESSION_TAG, reachable_redis

from . import realapp
from .sweep_flows import queues
from .workers import CeleryProcess, beat, worker

pytestmark = pytest.mark.slow

BROKER_REDIS_DB = 14  # this module's own: its queues are deleted afterwards
STUCK = 250  # lapsed steps the sweep re-sends to a queue no worker consumes
FAN_OUT = 30


@dataclass
class Cluster:
    """Beat and an orchestrating worker; the work queue's worker starts later."""

    env: dict[str, str]
    workdir: Path
    app: realapp.TestApp
    broker: redis.Redis
    nodes: list[CeleryProcess] = field(default_factory=list)

    def lose_work_messages(self) -> None:
        """Every message waiting on the work queue is gone (as in a broker restart)."""
        work, _ = queues(self.env)
        for key in self.broker.scan_iter(f"{work}*"):
            self.broker.delete(key)

    def start_work_worker(self, concurrency: int) -> None:
        work, _ = queues(self.env)
        name = f"work-{SESSION_TAG}"
        log = self.workdir / f"{name}.log"
        self.nodes.append(worker(self.env, [work], log, name, concurrency).wait_ready())

    def steps(self, workflow: str) -> list[sa.Row[tuple[object, ...]]]:
        engine = self.app.pikku.sql_engine
        assert engine is not None
        runs = realapp_runs(engine, workflow)
        with engine.connect() as conn:
            return list(conn.execute(sa.select(step_table).where(step_table.c.run_id.in_(runs))))

    def logs(self) -> str:
        return "\n".join(f"--- {n.log_path.name}\n{n.log()[-3000:]}" for n in self.nodes)


def realapp_runs(engine: sa.Engine, workflow: str) -> list[str]:
    from pikku_celery.sql.schema import run_table

    with engine.connect() as conn:
        q = sa.select(run_table.c.id).where(run_table.c.workflow == workflow)
        return list(conn.execute(q).scalars())


@pytest.fixture
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    url, client = reachable_redis(BROKER_REDIS_DB)
    env = {
        "PIKKU_T_BROKER": url,
        "PIKKU_T_DATABASE": f"sqlite:///{tmp_path / 'store.db'}",
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-sw-{request.node.name[5:20]}",
        "PIKKU_T_VISIBILITY": "30",
        "PIKKU_T_SWEEP": "1",
        "PIKKU_T_MARKS": str(tmp_path),
        "PIKKU_T_EXTRA": "tests.celery.sweep_flows",
    }
    app = realapp.build(env)
    app.pikku.store.prepare()  # type: ignore[attr-defined]
    c = Cluster(env, tmp_path, app, client)
    try:
        c.nodes.append(beat(env, tmp_path))
        name = f"orchestrate-{SESSION_TAG}"
        c.nodes.append(worker(env, app.queues, tmp_path / f"{name}.log", name, 2).wait_ready())
        yield c
    finally:
        for node in c.nodes:
            node.stop()
        for q in [*app.queues, *queues(env)]:
            for key in client.scan_iter(f"{q}*"):
                client.delete(key)
        assert app.pikku.sql_engine is not None
        app.pikku.sql_engine.dispose()


def _lapse(engine: sa.Engine, step_ids: list[str], ago_ms: int) -> None:
    """Mark steps running under a lease that ended ``ago_ms`` ago, as if their
    worker had been killed (attempt 1, retries left)."""
    with engine.begin() as conn:
        now = int(time.time() * 1000)
        conn.execute(
            step_table.update()
            .where(step_table.c.id.in_(step_ids))
            .values(
                status="running",
                attempt=1,
                worker="killed",
                claim_id="k" * 32,
                lease_expires_at=now - ago_ms,
            )
        )


def test_lapsed_steps_of_an_unserved_queue_never_starve_an_ordinary_one(cluster: Cluster) -> None:
    """Finding 3: 250 lapsed steps whose task no worker takes (re-sent, still
    lapsed, in backoff) and one ordinary lapsed step whose message was lost:
    the ordinary run completes."""
    pikku = cluster.app.pikku
    stuck = [pikku.start("sw.stuck").run_id for _ in range(STUCK)]
    ordinary = pikku.start("sw.one")
    wait_until(lambda: len(cluster.steps("sw.stuck")) == STUCK, timeout=60)
    wait_until(lambda: len(cluster.steps("sw.one")) == 1, timeout=60)
    engine = pikku.sql_engine
    assert engine is not None and len(stuck) == STUCK
    # the stuck ones lapsed first (oldest in the sweep's old order), the ordinary last
    _lapse(engine, [s.id for s in cluster.steps("sw.stuck")], ago_ms=120_000)
    _lapse(engine, [s.id for s in cluster.steps("sw.one")], ago_ms=1_000)
    cluster.lose_work_messages()
    cluster.start_work_worker(concurrency=2)
    try:
        assert ordinary.wait(timeout=60) == 7
    except Exception:
        print(cluster.logs())
        raise


def test_a_fan_out_whose_messages_were_lost_comes_back_in_one_sweep(cluster: Cluster) -> None:
    """Finding 4: 30 parallel 1 s steps whose messages were lost took 96 s
    (one step re-sent per sweep); all are re-sent in one sweep now."""
    run = cluster.app.pikku.start("sw.fanout", FAN_OUT)
    wait_until(lambda: len(cluster.steps("sw.fanout")) == FAN_OUT, timeout=60)
    cluster.lose_work_messages()
    started = time.monotonic()
    cluster.start_work_worker(concurrency=6)
    try:
        assert run.wait(timeout=120) == sum(range(FAN_OUT))
    except Exception:
        print(cluster.logs())
        raise
    took = time.monotonic() - started
    print(f"fan-out of {FAN_OUT} lost steps recovered in {took:.1f} s")  # shown with -s
    # message_grace (3 s) + a sweep (1 s) + 30 one-second steps on 6 processes,
    # with room for a loaded machine; one step per sweep needs 30 sweeps at least
    assert took < 30, took
