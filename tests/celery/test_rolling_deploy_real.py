"""A rolling deploy that lowers the visibility timeout takes over no live step.

Real workers on Redis and PostgreSQL: an "old" worker (visibility timeout
60 s, so a 60 s step lease renewed every 30 s) runs a step; a "new" worker and
beat (visibility timeout 6 s: a 6 s lease, a sweep every second) join the same
queue and store. Until the old worker has renewed its lease, the new fleet's
sweeps and Redis's early redelivery to the new worker must leave the step to
its owner: one execution of the body, attempt 1, its result recorded.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.helpers import wait_until
from tests.services import PG_ADMIN_URL, REDIS_URL, SESSION_TAG, scratch_database, unavailable

from . import realapp
from .workers import CeleryProcess, beat, worker

OLD_VISIBILITY = 60.0
NEW_VISIBILITY = 6.0
BROKER_REDIS_DB = 11

pytestmark = pytest.mark.slow


@dataclass
class Deploy:
    old_env: dict[str, str]
    new_env: dict[str, str]
    old: realapp.TestApp
    workdir: Path
    processes: list[CeleryProcess] = field(default_factory=list)

    def start_worker(self, env: dict[str, str], name: str) -> CeleryProcess:
        log = self.workdir / f"{name}.log"
        node = worker(env, self.old.queues, log, f"{name}-{SESSION_TAG}")
        self.processes.append(node)
        return node.wait_ready(60)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-3000:]}" for p in self.processes)


@pytest.fixture
def deploy(tmp_path: Path) -> Iterator[Deploy]:
    broker = LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + f"/{BROKER_REDIS_DB}")
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable("redis", exc)
    tag = uuid.uuid4().hex[:8]
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_deploy_{tag}") as url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(engine)
        realapp.side_effects.create(engine, checkfirst=True)
        realapp.ledger.create(engine, checkfirst=True)
        engine.dispose()
        common = {
            "PIKKU_T_BROKER": broker.url,
            "PIKKU_T_KEYPREFIX": broker.prefix,
            "PIKKU_T_DATABASE": url,
            "PIKKU_T_QUEUE": f"{SESSION_TAG}-deploy-{tag}",
            "PIKKU_T_MARKS": str(tmp_path),
            "PIKKU_T_EXTRA": "tests.celery.deploy_tasks",
            "PIKKU_T_SWEEP": "1",
        }
        old_env = {**common, "PIKKU_T_VISIBILITY": str(OLD_VISIBILITY)}
        new_env = {**common, "PIKKU_T_VISIBILITY": str(NEW_VISIBILITY)}
        old = realapp.build(old_env)
        d = Deploy(old_env, new_env, old, tmp_path)
        try:
            yield d
        finally:
            for process in d.processes:
                process.kill()
            broker.teardown()
            assert old.pikku.sql_engine is not None
            old.pikku.sql_engine.dispose()


def test_new_workers_with_a_shorter_lease_leave_an_old_workers_live_step_alone(
    deploy: Deploy,
) -> None:
    pikku = deploy.old.pikku
    queue = deploy.old.queues[0]
    assert pikku.lease_for_queue(queue).seconds == OLD_VISIBILITY
    deploy.start_worker(deploy.old_env, "old")
    key = f"deploy-{uuid.uuid4().hex[:8]}"
    run = pikku.start("t.deploy", key)

    def executions() -> int:
        return len(list(deploy.workdir.glob(f"{key}.*.run")))

    wait_until(lambda: executions() == 1, timeout=60)
    deploy.start_worker(deploy.new_env, "new")
    deploy.processes.append(beat(deploy.new_env, deploy.workdir))
    joined = time.monotonic()

    def renewed_by_old_worker() -> bool:
        """Until the old worker renews: the new fleet must not take the step."""
        [step] = run.steps()
        assert step.step.attempt == 1 and executions() == 1, deploy.logs()
        return step.attempts[0].renewals >= 1

    try:
        wait_until(renewed_by_old_worker, timeout=OLD_VISIBILITY, interval=0.2)
    except Exception:
        print(deploy.logs())
        raise
    watched = time.monotonic() - joined
    # The new fleet was at work meanwhile: it swept many times, each sweep
    # longer after the step was claimed than twice its own 6 s lease.
    assert watched > 2 * NEW_VISIBILITY, watched
    new_worker = deploy.processes[1]
    assert new_worker.log().count("pikku.sweep") >= 5, deploy.logs()

    (deploy.workdir / f"{key}.release").write_text("")
    assert run.wait(timeout=60) == f"released {key}"
    assert executions() == 1
    [step] = run.steps()
    assert [(a.attempt, a.status) for a in step.attempts] == [(1, AttemptStatus.SUCCEEDED)]
    print(f"new fleet watched a live 60 s lease for {watched:.1f} s, took nothing")
