"""A whole worker SIGKILLed mid-step is taken over within 90 s, with the defaults.

No visibility timeout, no consumer timeout, default ``step_lease`` and
``sweep_interval``: Redis would redeliver the message after kombu's hour and
RabbitMQ's consumer timeout is half an hour, yet the step's liveness lease
lapses within a minute of its worker's death and the sweep, run by a real
``celery beat``, sends it to the second worker. Real ``celery worker``
subprocesses; the killed worker's whole process group (main process and pool)
dies at once, just after it renewed the step's lease (the worst case). Each
test has its own queue (on Redis, its own key prefix too) and its own scratch
database, so nothing here touches another's workers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import Pikku
from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus
from pikku_celery.testing.nodes import LocalRabbitMQContainer, LocalRedisContainer
from tests.helpers import wait_until
from tests.services import (
    AMQP_URL,
    PG_ADMIN_URL,
    REDIS_URL,
    SESSION_TAG,
    scratch_database,
    unavailable,
)

from . import defaultsapp
from .workers import CeleryProcess, beat, worker

TAKEOVER_BOUND = 90.0  # the promise for the defaults
APP_MODULE = "tests.celery.defaultsapp"
BROKER_REDIS_DB = 11

pytestmark = pytest.mark.slow


@dataclass
class Fleet:
    kind: str
    env: dict[str, str]
    built: defaultsapp.DefaultsApp
    workdir: Path
    processes: list[CeleryProcess] = field(default_factory=list)

    def add_worker(self) -> CeleryProcess:
        name = f"d{len(self.processes)}-{SESSION_TAG}"
        log = self.workdir / f"{name}.log"
        node = worker(self.env, [self.built.queue], log, name, app_module=APP_MODULE)
        self.processes.append(node)
        return node.wait_ready(60)

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-3000:]}" for p in self.processes)


def _broker(kind: str) -> LocalRedisContainer | LocalRabbitMQContainer:
    broker: LocalRedisContainer | LocalRabbitMQContainer = (
        LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + f"/{BROKER_REDIS_DB}")
        if kind == "redis"
        else LocalRabbitMQContainer(AMQP_URL)
    )
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable(kind, exc)
    return broker


@contextmanager
def fleet_on(kind: str, tmp_path: Path) -> Iterator[Fleet]:
    """A beat and one worker of the defaults app on broker ``kind``."""
    broker = _broker(kind)
    tag = uuid.uuid4().hex[:8]
    workdir = tmp_path / kind
    workdir.mkdir()
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_takeover_{tag}") as url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(engine)
        engine.dispose()
        env = {
            "PIKKU_D_BROKER": broker.url,
            "PIKKU_D_DATABASE": url,
            "PIKKU_D_QUEUE": f"{SESSION_TAG}-takeover-{kind}-{tag}",
            "PIKKU_D_MARKS": str(workdir),
        }
        if isinstance(broker, LocalRedisContainer):
            env["PIKKU_D_KEYPREFIX"] = broker.prefix
        built = defaultsapp.build(env)
        f = Fleet(kind, env, built, workdir)
        try:
            f.processes.append(beat(env, f.workdir, app_module=APP_MODULE))
            f.add_worker()
            yield f
        finally:
            for process in f.processes:
                process.kill()
            if isinstance(broker, LocalRabbitMQContainer):
                broker.delete_queues([built.queue])
            broker.teardown()
            assert built.pikku.sql_engine is not None
            built.pikku.sql_engine.dispose()


def _renewals(pikku: Pikku, run_id: str) -> int:
    return sum(a.renewals for a in pikku.store.get_attempts(run_id))


@pytest.fixture
def fleets(tmp_path: Path) -> Iterator[list[Fleet]]:
    """A fleet on Redis and one on RabbitMQ, side by side: the two takeovers
    wait out their leases at the same time rather than one after the other."""
    with fleet_on("redis", tmp_path) as redis_fleet, fleet_on("rabbitmq", tmp_path) as amqp:
        yield [redis_fleet, amqp]


def takeover(fleet: Fleet) -> float:
    """Kill the worker running a step just after it renewed the lease; the
    seconds from the kill until the run completed on the other worker."""
    pikku = fleet.built.pikku
    lease = pikku.lease_for_queue(fleet.built.queue)
    # The defaults really are in force: the horizon is the broker's own default.
    assert lease.horizon == {"redis": 3600.0, "rabbitmq": 1800.0}[fleet.kind]
    assert (lease.seconds, pikku.sweep_interval) == (60.0, 15.0)
    assert pikku.takeover_within(fleet.built.queue) < TAKEOVER_BOUND

    key = f"victim-{uuid.uuid4().hex[:8]}"
    run = fleet.built.takeover.start(key)
    wait_until((fleet.workdir / f"{key}.pid").exists, timeout=60)
    fleet.add_worker()  # ready before the kill: the bound below is the lease's and the sweep's
    # The worst case: killed just after renewing, its lease as long as it gets.
    wait_until(lambda: _renewals(pikku, run.run_id) >= 1, timeout=lease.seconds, interval=0.1)
    fleet.processes[1].kill()  # the busy worker: main process and pool, SIGKILL to its group
    killed_at = time.monotonic()
    try:
        assert run.wait(timeout=TAKEOVER_BOUND + 30) == f"done {key}"
    except Exception:
        print(fleet.logs())
        raise
    took = time.monotonic() - killed_at
    print(f"{fleet.kind}: SIGKILL to completion {took:.1f} s")  # shown with -s
    (hang,) = run.steps()
    assert [a.status for a in hang.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
    return took


def test_a_sigkilled_worker_is_taken_over_within_90_s_with_the_defaults(
    fleets: list[Fleet],
) -> None:
    with ThreadPoolExecutor(len(fleets)) as pool:
        took = dict(zip((f.kind for f in fleets), pool.map(takeover, fleets), strict=True))
    assert all(seconds < TAKEOVER_BOUND for seconds in took.values()), took
