"""Progress events on real workers (PostgreSQL store): the run page's API,
polled from this process, sees each progress value while the run runs, in
order, and none is lost when the worker running it is SIGKILLed and another
takes the run over and goes on setting events.

The default run kills one worker on Redis; ``PIKKU_LONG=1`` adds a longer run
killed three times, on Redis and on RabbitMQ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery import RunStatus
from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus
from pikku_celery.testing.nodes import LocalRabbitMQContainer, LocalRedisContainer
from pikku_celery.web.api import RunApi
from pikku_celery.web.permissions import read_only
from tests.helpers import long_form, wait_until
from tests.services import AMQP_URL, REDIS_URL, SESSION_TAG, unavailable

from . import realapp
from .workers import CeleryProcess, beat, worker

pytestmark = pytest.mark.slow

VISIBILITY = 3.0  # the lease a killed worker's step holds: takeover within it + a sweep


@pytest.fixture(scope="module")
def events_db(postgres_url: str) -> str:
    """The session's scratch PostgreSQL database, with pikku's tables."""
    engine = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    metadata.create_all(engine)
    engine.dispose()
    return postgres_url


@dataclass
class Cluster:
    app: realapp.TestApp
    workdir: Path
    add_worker: Callable[[], CeleryProcess]
    nodes: list[CeleryProcess] = field(default_factory=list)


@pytest.fixture(params=["redis"])
def cluster(request: pytest.FixtureRequest, events_db: str, tmp_path: Path) -> Iterator[Cluster]:
    kind = request.param
    broker: LocalRedisContainer | LocalRabbitMQContainer = (
        LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + "/11")
        if kind == "redis"
        else LocalRabbitMQContainer(AMQP_URL)
    )
    try:
        broker.ready(timeout=5)
    except ConnectionError as exc:
        unavailable(kind, exc)
    env = {
        "PIKKU_T_BROKER": broker.url,
        "PIKKU_T_DATABASE": events_db,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-events-{kind}-{request.node.name[:12]}",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": "1",
        "PIKKU_T_MARKS": str(tmp_path),
        "PIKKU_T_EXTRA": "tests.celery.event_flows",
    }
    if isinstance(broker, LocalRedisContainer):
        env["PIKKU_T_KEYPREFIX"] = broker.prefix
    built = realapp.build(env)
    nodes: list[CeleryProcess] = []

    def add_worker() -> CeleryProcess:
        name = f"ev{len(nodes)}-{SESSION_TAG}"
        node = worker(env, built.queues, tmp_path / f"{name}.log", name, 1).wait_ready()
        nodes.append(node)
        return node

    try:
        nodes.append(beat(env, tmp_path))
        yield Cluster(built, tmp_path, add_worker, nodes)
    finally:
        for node in nodes:
            node.kill()
        if isinstance(broker, LocalRabbitMQContainer):
            broker.delete_queues(built.queues)
        broker.teardown()
        assert built.pikku.sql_engine is not None
        built.pikku.sql_engine.dispose()


def _progress(api: RunApi, run_id: str) -> tuple[str, list[int]]:
    """What the page shows: the run's status and its progress values so far."""
    shown = api.run(run_id).body
    done = [e["value"]["done"] for e in shown["events"] if e["key"] == "progress"]
    return shown["run"]["status"], done


def _killed_and_watched(cluster: Cluster, chunks: int, hang_at: list[int]) -> None:
    """A run of ``chunks`` steps, an event after each, whose worker is
    SIGKILLed in each chunk of ``hang_at``; the page's API polled throughout."""
    pikku = cluster.app.pikku
    api = RunApi(pikku, read_only)
    current = cluster.add_worker()
    job = {"key": "progress", "chunks": chunks, "hang_at": hang_at, "seconds": 0.15}
    run = pikku.start("t.events.progress", job)
    polls: list[tuple[str, list[int]]] = []

    def poll() -> tuple[str, list[int]]:
        polls.append(_progress(api, run.run_id))
        return polls[-1]

    killed_at: list[int] = []
    for chunk in hang_at:
        mark = cluster.workdir / f"progress-{chunk}.pid"
        wait_until(lambda: poll() and mark.exists(), timeout=60)  # noqa: B023 - called here
        # The chunk hangs: the values before it are on the page, the run runs.
        assert poll() == ("running", list(range(1, chunk + 1)))
        spare = cluster.add_worker()  # ready before the kill: it takes the run over
        current.kill()
        killed_at.append(len(polls))
        current = spare
    assert run.get_event("stage", timeout=5) == "started"
    wait_until(lambda: poll()[0] != "running", timeout=120)
    assert run.wait(timeout=5) == chunks

    # Every poll saw a prefix of the next: in order, nothing lost or repeated.
    for (_, before), (_, after) in pairwise(polls):
        assert after[: len(before)] == before, (before, after)
    assert polls[-1] == ("completed", list(range(1, chunks + 1)))
    # After each takeover the page saw the run go on setting events.
    for at, chunk in zip(killed_at, hang_at, strict=True):
        later = [done for status, done in polls[at:] if status == "running"]
        assert any(len(done) > chunk for done in later), (chunk, later[-1:])
    assert run.get_event("progress") == {"done": chunks, "of": chunks}
    assert run.get_event("stage") == "finished"
    assert [(e.key, e.number) for e in run.events()][-2:] == [
        ("progress", chunks - 1),
        ("stage", 1),
    ]
    for chunk in hang_at:
        (hung,) = [h for h in run.steps() if h.step.name == f"chunk-{chunk}"]
        statuses = [a.status for a in hung.attempts]
        assert statuses == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
        assert hung.attempts[0].worker != hung.attempts[1].worker
    assert run.status() == RunStatus.COMPLETED


def test_the_page_sees_progress_in_order_and_none_is_lost_across_a_sigkill(
    cluster: Cluster,
) -> None:
    _killed_and_watched(cluster, chunks=8, hang_at=[3])


@long_form("a longer run killed three times, on Redis and on RabbitMQ")
@pytest.mark.parametrize("cluster", ["redis", "rabbitmq"], indirect=True)
def test_a_long_run_killed_three_times_loses_no_progress(cluster: Cluster) -> None:
    _killed_and_watched(cluster, chunks=60, hang_at=[5, 25, 45])
