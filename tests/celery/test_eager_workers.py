"""Eager steps on real `celery worker` subprocesses (Redis and RabbitMQ, PostgreSQL store).

What runs eagerly and what travels as a message, the durable commits a step
costs (counted on the server, in the write-ahead log), the budget, a warm
shutdown, and the crash cases: a worker SIGKILLed or SIGSTOPped mid-eager-step,
PostgreSQL crashed. The store is a throwaway PostgreSQL of the module's own
(:mod:`tests.throwaway`), so the crash never touches the shared server.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import sqlalchemy as sa

from pikku_celery.model.values import BROKER, EAGER
from pikku_celery.store import AttemptStatus
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.helpers import wait_until
from tests.services import SESSION_TAG
from tests.throwaway import ThrowawayPostgres
from tests.wal import database_oid, wal_position, write_transactions

from . import eagerapp, realapp
from .test_real_workers import _broker, pg_tables, tear_down  # noqa: F401 - a fixture
from .workers import CeleryProcess, beat_argv, worker_argv

VISIBILITY = 3.0
SWEEP = 1.0

pytestmark = pytest.mark.slow


class EagerProcess(CeleryProcess):
    app_module = "tests.celery.eagerapp"


@dataclass
class Cluster:
    """Workers and a beat of one test app module (``process``'s), on one broker."""

    kind: str
    env: dict[str, str]
    app: realapp.TestApp
    workdir: Path
    workers: list[CeleryProcess] = field(default_factory=list)
    beat: CeleryProcess | None = None
    process: ClassVar[type[CeleryProcess]] = EagerProcess
    prefix: ClassVar[str] = "e"  # the workers' node names

    def add_worker(self, queues: list[str] | None = None, pool: str = "prefork") -> CeleryProcess:
        name = f"{self.prefix}{len(self.workers)}-{SESSION_TAG}"
        argv = worker_argv(queues or self.app.queues[:2], name, 1)
        argv[argv.index("--pool") + 1] = pool
        w = self.process(argv, self.env, self.workdir / f"{name}.log").start()
        self.workers.append(w)
        return w.wait_ready()

    def start_beat(self) -> None:
        self.beat = self.process(beat_argv(self.workdir), self.env, self.workdir / "beat.log")
        self.beat.start().wait_ready()

    def logs(self) -> str:
        parts = [f"--- {p.log_path.name}\n{p.log()[-4000:]}" for p in self.workers]
        if self.beat is not None:
            parts.append(f"--- beat\n{self.beat.log()[-2000:]}")
        return "\n".join(parts)


ClusterT = TypeVar("ClusterT", bound=Cluster)


def make_cluster(
    request: pytest.FixtureRequest, pg_url: str, workdir: Path, **extra: str
) -> Iterator[Cluster]:
    name = request.node.name[:24].replace("[", "-").replace("]", "")
    kind = request.param
    yield from cluster_of(
        Cluster, eagerapp.build, kind, pg_url, workdir, f"e{kind}-{name}", **extra
    )


def cluster_of(
    cls: type[ClusterT],
    build: Callable[[dict[str, str]], realapp.TestApp],
    kind: str,
    pg_url: str,
    workdir: Path,
    queue: str,
    **extra: str,
) -> Iterator[ClusterT]:
    """A ``cls`` cluster of the app ``build`` makes, on a ``kind`` broker of
    its own, torn down (workers, beat, broker, app) when the caller is done."""
    broker = _broker(kind)
    env = {
        "PIKKU_T_BROKER": broker.url,
        "PIKKU_T_DATABASE": pg_url,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-{queue}",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": str(SWEEP),
        "PIKKU_T_MARKS": str(workdir),
        **extra,
    }
    if isinstance(broker, LocalRedisContainer):
        env["PIKKU_T_KEYPREFIX"] = broker.prefix
    app = build(env)
    c = cls(kind, env, app, workdir)
    try:
        yield c
    finally:
        tear_down([*c.workers, c.beat], broker, app)


def ledger_keys(cluster: Cluster, key: str) -> list[str]:
    """The ledger rows (one per step body that ran) of the run started as ``key``."""
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(realapp.ledger.c.key).where(realapp.ledger.c.key.like(f"{key}:%"))
        ).scalars()
        return sorted(rows)


@pytest.fixture(params=["redis", "rabbitmq"])
def cluster(request: pytest.FixtureRequest, pg_tables: str, tmp_path: Path) -> Iterator[Cluster]:  # noqa: F811
    yield from make_cluster(request, pg_tables, tmp_path)


@pytest.fixture(params=["redis", "rabbitmq"])
def budget_cluster(
    request: pytest.FixtureRequest,
    pg_tables: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[Cluster]:
    yield from make_cluster(request, pg_tables, tmp_path, PIKKU_T_EAGER_MAX="3")


def dispatches(run: Any) -> dict[str, list[tuple[str | None, AttemptStatus]]]:
    """Each step's attempts as (dispatch, status), in attempt order."""
    return {h.step.name: [(a.dispatch, a.status) for a in h.attempts] for h in run.steps()}


def waited(cluster: Cluster, run: Any, timeout: float = 60) -> Any:
    try:
        return run.wait(timeout=timeout)
    except Exception:
        print(cluster.logs())
        raise


@pytest.fixture(scope="module")
def wal(throwaway_pg: ThrowawayPostgres) -> Iterator[sa.Engine]:
    engine = sa.create_engine(throwaway_pg.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
    yield engine
    engine.dispose()


def test_a_ten_step_run_runs_eagerly_at_one_durable_commit_per_step(
    cluster: Cluster,
    wal: sa.Engine,
    pg_tables: str,  # noqa: F811
) -> None:
    cluster.add_worker()
    ten = cluster.app.workflows["ten"]
    waited(cluster, ten.start("warm-up"))  # connections made, statements prepared
    with wal.connect() as conn:
        oid = database_oid(conn, sa.make_url(pg_tables).database or "")
        since = wal_position(conn)
    run = ten.start("measured")
    wait_until((cluster.workdir / "measured.done").exists, timeout=60)
    # The last step's pass (which ends the run) follows its body's file.
    wait_until(lambda: run.status().terminal, timeout=30)
    with wal.connect() as conn:
        written = write_transactions(conn, oid, since, wal_position(conn))
    assert run.result() == 10
    seen = dispatches(run)
    assert seen["s0"] == [(BROKER, AttemptStatus.SUCCEEDED)]
    assert all(seen[f"s{i}"] == [(EAGER, AttemptStatus.SUCCEEDED)] for i in range(1, 10)), seen
    # start(): the run with its first pass; the worker: the message's claim
    # (an asynchronous commit), then one pass per step, each recording the
    # step's outcome and claiming the next step (the last one ends the run).
    print(f"{cluster.kind}: {written} write transactions for a 10-step run")
    assert written == 1 + 1 + 10, written


def test_steps_that_cannot_run_here_travel_through_the_broker(cluster: Cluster) -> None:
    """Another queue's step, a rate-limited task, a retried attempt and a
    fan-out's other branches are messages; the rest is eager (a task with a
    time limit too: its limit is enforced in the worker's process)."""
    other = cluster.app.queues[2]
    cluster.add_worker()
    cluster.add_worker(queues=[other])
    run = cluster.app.workflows["mixed"].start("mixed")
    assert waited(cluster, run) == [7, 8, 9]
    seen = dispatches(run)
    assert seen["a"] == [(BROKER, AttemptStatus.SUCCEEDED)]
    assert seen["other-queue"] == [(BROKER, AttemptStatus.SUCCEEDED)]
    assert seen["rate-limited"] == [(BROKER, AttemptStatus.SUCCEEDED)]
    assert seen["time-limited"] == [(EAGER, AttemptStatus.SUCCEEDED)]
    assert seen["retried"] == [(EAGER, AttemptStatus.FAILED), (BROKER, AttemptStatus.SUCCEEDED)]
    assert seen["after"] == [(EAGER, AttemptStatus.SUCCEEDED)]
    branches = sorted(seen[f"branch{i}"][0][0] or "" for i in range(3))
    assert branches == [BROKER, BROKER, EAGER]


def test_the_budget_hands_the_run_back_to_the_broker(budget_cluster: Cluster) -> None:
    budget_cluster.add_worker()
    run = budget_cluster.app.workflows["ten"].start("budget")
    assert waited(budget_cluster, run) == 10
    seen = dispatches(run)
    order = [seen[f"s{i}"][0][0] for i in range(10)]
    assert order == [BROKER, EAGER, EAGER, EAGER] * 2 + [BROKER, EAGER], order


def test_a_warm_shutdown_publishes_the_next_step_instead(cluster: Cluster) -> None:
    first = cluster.add_worker()
    run = cluster.app.workflows["slow_chain"].start({"steps": 8, "seconds": 0.15})
    wait_until(lambda: len([h for h in run.steps() if h.step.status == "succeeded"]) >= 2, 30)
    assert first.proc is not None
    os.kill(first.proc.pid, signal.SIGTERM)  # warm: the step running finishes
    first.proc.wait(30)
    cluster.add_worker()
    assert waited(cluster, run) == 8
    order = [dispatches(run)[f"s{i}"][0][0] for i in range(8)]
    # eager until the shutdown; the step after it was published (and taken
    # by the next worker, which runs the rest eagerly)
    published = [i for i, d in enumerate(order) if d == BROKER]
    assert published[0] == 0 and len(published) == 2, order
    assert 2 <= published[1] <= 4, order
    assert all(d == EAGER for i, d in enumerate(order) if i not in published), order


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)  # crashes: one broker
def test_a_worker_sigkilled_mid_eager_step_is_taken_over(cluster: Cluster) -> None:
    cluster.start_beat()
    cluster.add_worker()
    key = f"kill-{cluster.kind}"
    run = cluster.app.workflows["kill_mid"].start(key)
    wait_until((cluster.workdir / f"{key}.pid").exists, timeout=30)
    cluster.add_worker()
    cluster.workers[0].kill()
    killed_at = time.monotonic()
    assert waited(cluster, run) == 3
    recovery = time.monotonic() - killed_at
    seen = dispatches(run)
    assert seen["a"] == [(BROKER, AttemptStatus.SUCCEEDED)]  # the carrying message's own step
    assert seen["b"] == [(EAGER, AttemptStatus.SUPERSEDED), (BROKER, AttemptStatus.SUCCEEDED)]
    print(f"{cluster.kind}: kill to completion {recovery:.2f} s")
    assert recovery <= VISIBILITY + SWEEP + 2, recovery
    # The carrying message came back (unacked when its worker died): it found
    # its step settled. Each ledger row is there once.
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        keys = conn.execute(
            sa.select(realapp.ledger.c.key).where(realapp.ledger.c.key.like(f"{key}:%"))
        ).scalars()
        assert sorted(keys) == [f"{key}:a", f"{key}:c"]


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)  # crashes: one broker
def test_a_stopped_eager_attempt_lands_nothing_once_superseded(cluster: Cluster) -> None:
    cluster.start_beat()
    stopped = cluster.add_worker()
    key = f"stop-{cluster.kind}"
    run = cluster.app.workflows["stop_mid"].start(key)
    wait_until((cluster.workdir / f"{key}.pid").exists, timeout=30)
    assert stopped.proc is not None
    os.killpg(stopped.proc.pid, signal.SIGSTOP)
    try:
        cluster.add_worker()
        assert waited(cluster, run) == 3
    finally:
        os.killpg(stopped.proc.pid, signal.SIGCONT)
    # The stopped attempt runs on and tries to record -1 in its transaction.
    refusal = "refused a superseded transactional step"
    wait_until(lambda: refusal in stopped.log(), timeout=30)
    history = {h.step.name: h for h in run.steps()}
    seen = dispatches(run)
    assert seen["b"] == [(EAGER, AttemptStatus.SUPERSEDED), (BROKER, AttemptStatus.SUCCEEDED)]
    assert history["b"].step.result == 2
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        pids = conn.execute(
            sa.select(realapp.ledger.c.pid).where(realapp.ledger.c.key == key)
        ).scalars()
        assert len(list(pids)) == 1  # the stopped attempt's row rolled back


@pytest.mark.parametrize("cluster", ["redis"], indirect=True)  # crashes: one broker
def test_every_ledger_row_once_across_an_immediate_postgresql_restart(
    cluster: Cluster, throwaway_pg: ThrowawayPostgres
) -> None:
    """Claims commit asynchronously: a crash (``-m immediate``, no checkpoint)
    may lose some, and their steps then run again under a new claim id. Every
    run still completes, and each transactional step's ledger row, committed
    with its outcome, is there exactly once."""
    cluster.start_beat()
    cluster.add_worker()
    cluster.add_worker()
    ledger_five = cluster.app.workflows["ledger_five"]
    keys = [f"crash-{cluster.kind}-{i}" for i in range(20)]
    runs = [ledger_five.start(key) for key in keys]
    wait_until(lambda: sum(len(r.steps()) for r in runs) > 20, timeout=30)
    throwaway_pg.restart("immediate")  # a crash: asynchronous claims may be lost
    for r in runs:
        try:
            wait_until(lambda r=r: _settled(r), timeout=120)
            assert r.wait(timeout=5) == 5
        except Exception:
            print(cluster.logs())
            raise
        for h in r.steps():
            succeeded = [a for a in h.attempts if a.status == AttemptStatus.SUCCEEDED]
            assert len(succeeded) == 1, (h.step.name, h.attempts)
    engine = cluster.app.pikku.sql_engine
    assert engine is not None
    with engine.connect() as conn:
        written = conn.execute(
            sa.select(realapp.ledger.c.key).where(
                realapp.ledger.c.key.like(f"crash-{cluster.kind}-%")
            )
        ).scalars()
        rows = sorted(written)
    assert rows == sorted(f"{key}:{i}" for key in keys for i in range(5))


def _settled(run: Any) -> bool:
    try:
        return bool(run.status().terminal)
    except sa.exc.OperationalError:
        return False
