"""Payload bounds on real workers (Redis broker, MariaDB store): a stored value
too deep to decode fails its run with the reason, cancel ends a run whatever it
holds, and a result larger than the server's packet fails its step at once.

Before these bounds a signal nested ~950 deep wedged its run for good (every
pass raised ``RecursionError``; the run stayed running and cancel never ended
it), and a result over MariaDB's ``max_allowed_packet`` was retried as an
outage ("server has gone away") with the step left running.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pikku_celery import RunStatus, WorkflowFailedError
from pikku_celery.sql.schema import signal_table
from tests.celery import realapp
from tests.celery.workers import CeleryProcess, beat, worker
from tests.helpers import wait_until
from tests.services import MYSQL_ADMIN_URL, REDIS_URL, SESSION_TAG, reachable_redis
from tests.store.conftest import migrated_engine

TOO_DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def bounds_db() -> Iterator[sa.Engine]:
    yield from migrated_engine(MYSQL_ADMIN_URL, f"{SESSION_TAG}_bounds")


@pytest.fixture(scope="module")
def cluster(bounds_db: sa.Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reachable_redis()
    workdir = tmp_path_factory.mktemp("bounds")
    env = {
        "PIKKU_T_BROKER": REDIS_URL,
        "PIKKU_T_DATABASE": bounds_db.url.render_as_string(hide_password=False),
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-bounds",
        "PIKKU_T_VISIBILITY": "10",
        "PIKKU_T_SWEEP": "1",
        "PIKKU_T_MARKS": str(workdir),
        "PIKKU_T_EXTRA": "tests.reliability.boundsapp",
    }
    built = realapp.build(env)  # with the workers' own tasks (PIKKU_T_EXTRA)
    nodes: list[CeleryProcess] = []
    try:
        nodes.append(beat(env, workdir))
        nodes.append(
            worker(env, built.queues, workdir / "w.log", f"bounds-{SESSION_TAG}", 2).wait_ready()
        )
        yield built
    finally:
        for node in nodes:
            node.stop()
        client = redis.Redis.from_url(REDIS_URL)
        for queue in built.queues:
            client.delete(queue)
        assert built.pikku.sql_engine is not None
        built.pikku.sql_engine.dispose()


def plant_signal(engine: sa.Engine, run_id: str, name: str, text: str) -> None:
    """A signal stored unchecked, as an older release or an operator could have."""
    with engine.begin() as conn:
        conn.execute(
            sa.insert(signal_table).values(run_id=run_id, name=name, payload=text, created_at=0)
        )


def waiting_for(pikku: Any, run_id: str, signal: str) -> bool:
    return any(s.step.name == f"signal:{signal}" for s in pikku.handle(run_id).steps())


def test_a_stored_signal_too_deep_to_decode_fails_its_run_with_the_reason(
    cluster: Any, bounds_db: sa.Engine
) -> None:
    pikku = cluster.pikku
    run = pikku.start("t.bounds.approval")
    wait_until(lambda: waiting_for(pikku, run.run_id, "first"), timeout=30)
    plant_signal(bounds_db, run.run_id, "first", TOO_DEEP)
    pikku.send_signal(run.run_id, "nudge", 1)  # a wake-up: the pass reads every signal
    with pytest.raises(WorkflowFailedError) as failed:
        run.wait(timeout=60)
    assert "signal 'first' payload holds invalid JSON" in str(failed.value)


def test_cancel_ends_a_run_whatever_its_stored_values_hold(
    cluster: Any, bounds_db: sa.Engine
) -> None:
    pikku = cluster.pikku
    run = pikku.start("t.bounds.approval")
    wait_until(lambda: waiting_for(pikku, run.run_id, "first"), timeout=30)
    plant_signal(bounds_db, run.run_id, "second", TOO_DEEP)
    pikku.cancel(run.run_id)
    wait_until(lambda: run.status() == RunStatus.CANCELLED, timeout=60)


def test_a_result_larger_than_the_server_packet_fails_its_step_at_once(
    cluster: Any, bounds_db: sa.Engine
) -> None:
    with bounds_db.connect() as conn:
        packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
    pikku = cluster.pikku
    run = pikku.start("t.bounds.sized", packet // 2 + 1)
    outcome = run.wait(timeout=60)
    assert "above the limit of" in outcome["refused"]
    assert f"max_allowed_packet of {packet} bytes" in outcome["refused"]
    [step] = run.steps()
    assert [a.attempt for a in step.attempts] == [1]
    fits = pikku.start("t.bounds.sized", 1000)
    assert fits.wait(timeout=60) == "x" * 1000
