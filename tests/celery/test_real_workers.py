"""Real `celery worker` subprocesses on Redis and RabbitMQ, PostgreSQL store.

Workers are killed with SIGKILL, the broker is flushed and PostgreSQL is
restarted under running workflows; every run still ends, with each step's
outcome written once, by its current attempt. Workers and brokers are the
local nodes of pikku's pytest-celery plugin: a Redis broker is a key prefix
of its own (flushing it loses this test's messages only), a RabbitMQ broker
the server's default virtual host with this test's queues. The store is a
throwaway PostgreSQL of the module's own (:mod:`tests.throwaway`): the
restart must never touch the shared server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus, RunStatus, StepKind
from pikku_celery.testing.nodes import LocalRabbitMQContainer, LocalRedisContainer
from tests.helpers import wait_until
from tests.services import AMQP_URL, REDIS_URL, SESSION_TAG, unavailable
from tests.throwaway import ThrowawayPostgres

from . import realapp
from .workers import CeleryProcess, beat, worker

VISIBILITY = 3.0
SWEEP = 1.0
BROKER_REDIS_DB = 11

pytestmark = pytest.mark.slow


def _redis_broker_url() -> str:
    return REDIS_URL.rsplit("/", 1)[0] + f"/{BROKER_REDIS_DB}"


@dataclass
class Cluster:
    kind: str
    env: dict[str, str]
    app: realapp.TestApp
    workdir: Path
    broker: LocalRedisContainer | LocalRabbitMQContainer
    workers: list[CeleryProcess]
    beat: CeleryProcess | None = None

    def add_worker(self, concurrency: int = 2) -> CeleryProcess:
        name = f"w{len(self.workers)}-{SESSION_TAG}"
        w = worker(self.env, self.app.queues, self.workdir / f"{name}.log", name, concurrency)
        self.workers.append(w)
        return w.wait_ready()

    def logs(self) -> str:
        parts = [f"--- {p.log_path.name}\n{p.log()[-4000:]}" for p in self.workers]
        if self.beat is not None:
            parts.append(f"--- beat\n{self.beat.log()[-2000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def pg_tables(throwaway_pg: ThrowawayPostgres) -> str:
    postgres_url = throwaway_pg.database_url(SESSION_TAG)
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    metadata.create_all(engine)
    realapp.side_effects.create(engine, checkfirst=True)
    realapp.ledger.create(engine, checkfirst=True)
    engine.dispose()
    return postgres_url


def _broker(kind: str) -> LocalRedisContainer | LocalRabbitMQContainer:
    """The test's broker node: a key prefix on Redis, or RabbitMQ's default vhost."""
    broker: LocalRedisContainer | LocalRabbitMQContainer = (
        LocalRedisContainer(_redis_broker_url())
        if kind == "redis"
        else LocalRabbitMQContainer(AMQP_URL)
    )
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable(kind, exc)
    return broker


@pytest.fixture(params=["redis", "rabbitmq"])
def cluster(request: pytest.FixtureRequest, pg_tables: str, tmp_path: Path) -> Iterator[Cluster]:
    kind = request.param
    broker = _broker(kind)
    env = {
        "PIKKU_T_BROKER": broker.url,
        "PIKKU_T_DATABASE": pg_tables,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-{kind}-{request.node.name[:20]}".replace("[", "-").replace(
            "]", ""
        ),
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": str(SWEEP),
        "PIKKU_T_MARKS": str(tmp_path),
    }
    if isinstance(broker, LocalRedisContainer):
        env["PIKKU_T_KEYPREFIX"] = broker.prefix
    app = realapp.build(env)
    c = Cluster(kind, env, app, tmp_path, broker, [])
    try:
        c.beat = beat(env, tmp_path)
        c.add_worker()
        yield c
    finally:
        tear_down([*c.workers, c.beat], broker, app)


def tear_down(
    processes: list[CeleryProcess | None],
    broker: LocalRedisContainer | LocalRabbitMQContainer,
    app: realapp.TestApp,
) -> None:
    """After a test: its workers and beat killed (nothing is checked after
    it), its broker's messages and queues gone, its store's pool closed."""
    for process in processes:
        if process is not None:
            process.kill()
    if isinstance(broker, LocalRabbitMQContainer):
        broker.delete_queues(app.queues)
    broker.teardown()
    assert app.pikku.sql_engine is not None
    app.pikku.sql_engine.dispose()


def test_a_five_step_order_completes_on_real_workers(cluster: Cluster) -> None:
    order = cluster.app.workflows["order"]
    run = order.start({"id": 11, "cents": 500, "skus": ["x", "y", "z"]})
    try:
        output = run.wait(timeout=60)
    except Exception:
        print(cluster.logs())
        raise
    assert output["shipped"] == "label-11"
    assert output["reserved"] == ["reserved x", "reserved y", "reserved z"]
    history = {h.step.name: h for h in run.steps()}
    assert [a.status for a in history["charge"].attempts] == [
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]
    assert {n for n in history} == {
        "charge",
        "reserve-x",
        "reserve-y",
        "reserve-z",
        "cooling-off",
        "ship",
    }


def test_a_sigkilled_worker_is_taken_over_once_its_lease_lapses(cluster: Cluster) -> None:
    run = cluster.app.workflows["takeover"].start("victim")
    mark = cluster.workdir / "victim.pid"
    wait_until(mark.exists, timeout=30)
    cluster.add_worker()  # ready before the kill: the bound below is the lease's
    cluster.workers[0].kill()
    killed_at = time.monotonic()
    try:
        assert run.wait(timeout=60) == "done victim"
    except Exception:
        print(cluster.logs())
        raise
    recovery = time.monotonic() - killed_at
    (hang,) = run.steps()
    assert hang.step.attempt == 2
    assert [a.status for a in hang.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
    assert hang.attempts[0].result is None
    print(f"{cluster.kind}: kill to completion {recovery:.2f} s")  # shown with -s
    assert recovery <= VISIBILITY + SWEEP + 2, recovery


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_a_transaction_killed_before_commit_leaves_no_row(cluster: Cluster) -> None:
    key = f"ledger-{SESSION_TAG}"
    run = cluster.app.workflows["ledger"].start(key)
    wait_until((cluster.workdir / f"{key}.pid").exists, timeout=30)
    victim = int((cluster.workdir / f"{key}.pid").read_text())
    cluster.add_worker()
    cluster.workers[0].kill()  # mid-transaction: its ledger row is not committed
    assert run.wait(timeout=60) == f"booked {key}"
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        pids = (
            conn.execute(sa.select(realapp.ledger.c.pid).where(realapp.ledger.c.key == key))
            .scalars()
            .all()
        )
    assert len(pids) == 1 and pids[0] != victim  # exactly one row, by attempt 2
    (book,) = run.steps()
    assert [a.status for a in book.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]


def _executions(cluster: Cluster, key: str) -> int:
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        n = conn.execute(
            sa.select(realapp.side_effects.c.n).where(realapp.side_effects.c.name == key)
        ).scalar()
    return int(n or 0)


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_a_step_outliving_the_visibility_timeout_runs_its_body_once(cluster: Cluster) -> None:
    cluster.add_worker()  # an idle worker ready to receive the redelivered copy
    key = f"slow-{SESSION_TAG}"
    run = cluster.app.workflows["slow"].start({"key": key, "seconds": VISIBILITY * 2.5})
    assert run.wait(timeout=60) == key
    # Redis did hand the message out again while the body still ran ...
    # (the worker's log names the step's own task: pikku's message carries it as shadow)
    received = re.findall(r"Task t\.slow_once\[([0-9a-f-]+)\] received", cluster.logs())
    assert any(received.count(i) >= 2 for i in received), "no redelivery happened"
    # ... and the body still ran once.
    assert _executions(cluster, key) == 1
    (slow,) = run.steps()
    assert slow.step.attempt == 1 and len(slow.attempts) == 1


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_all_runs_complete_after_the_broker_is_flushed(cluster: Cluster) -> None:
    five = cluster.app.workflows["five"]
    runs = [five.start(i) for i in range(20)]
    wait_until(lambda: any(r.steps() and len(r.steps()) > 2 for r in runs), timeout=30)
    assert isinstance(cluster.broker, LocalRedisContainer)
    assert cluster.broker.flush() > 0  # every queued and unacked message of the test: lost
    for i, r in enumerate(runs):
        try:
            assert r.wait(timeout=90) == sum(2 * (i + k) for k in range(5))
        except Exception:
            print(cluster.logs())
            raise


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)
def test_all_runs_complete_across_a_postgresql_restart(
    cluster: Cluster, throwaway_pg: ThrowawayPostgres
) -> None:
    five = cluster.app.workflows["five"]
    runs = [five.start(100 + i) for i in range(20)]
    wait_until(lambda: any(len(r.steps()) > 2 for r in runs), timeout=30)
    throwaway_pg.restart("fast")
    for i, r in enumerate(runs):
        try:
            assert wait_until(lambda r=r: _settled(r), timeout=120)
            assert r.wait(timeout=1) == sum(2 * (100 + i + k) for k in range(5))
        except Exception:
            print(cluster.logs())
            raise
        history = r.steps()
        # No result lost or duplicated: each step succeeded once, by its final attempt.
        for h in history:
            succeeded = [a for a in h.attempts if a.status == AttemptStatus.SUCCEEDED]
            assert len(succeeded) == (1 if h.attempts else 0)


def _settled(run: object) -> bool:
    try:
        return bool(run.status() in (RunStatus.COMPLETED, RunStatus.FAILED))  # type: ignore[attr-defined]
    except sa.exc.OperationalError:
        return False


def test_a_prefork_worker_s_metrics_count_every_child(cluster: Cluster, tmp_path: Path) -> None:
    # Only the measured worker takes steps: the fixture's own one stops.
    for running in cluster.workers:
        running.stop()
    samples_dir = tmp_path / "prometheus"
    samples_dir.mkdir()
    env = {**cluster.env, "PIKKU_T_METRICS": "1", "PROMETHEUS_MULTIPROC_DIR": str(samples_dir)}
    name = f"metrics-{SESSION_TAG}"
    measured = worker(env, cluster.app.queues, tmp_path / f"{name}.log", name, concurrency=2)
    cluster.workers.append(measured.wait_ready())
    order = cluster.app.workflows["order"]
    runs = [order.start({"id": 30 + i, "cents": 100, "skus": ["a", "b"]}) for i in range(4)]
    try:
        for run in runs:
            run.wait(timeout=60)
    except Exception:
        print(cluster.logs())
        raise
    pikku = cluster.app.pikku
    task_attempts: list[AttemptStatus] = []
    for run in runs:
        histories = run.steps()
        for history in list(histories):
            if history.step.child_run_id:
                histories += pikku.handle(history.step.child_run_id).steps()
        for history in histories:
            if history.step.kind == StepKind.TASK:
                task_attempts += [a.status for a in history.attempts]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(samples_dir))
    counted = {
        sample.labels["outcome"]: sample.value
        for family in registry.collect()
        if family.name == "pikku_worker_step_outcomes"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    # Every attempt of every pool process is counted, whichever child ran it.
    assert counted.get("succeeded") == task_attempts.count(AttemptStatus.SUCCEEDED)
    assert counted.get("retrying") == task_attempts.count(AttemptStatus.FAILED) == len(runs)
