"""A real worker and beat for the canvas tests: Redis broker and result
backend, PostgreSQL store, the canvas tasks of :mod:`tests.canvas.canvasapp`.

The broker, the result backend and the records are databases of a throwaway Redis of the
module's own (:mod:`tests.throwaway`): the broker-loss test flushes a whole
database, which on the shared Redis would lose other sessions' messages too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pikku_celery.sql.schema import metadata
from tests.celery import realapp
from tests.celery.workers import CeleryProcess, beat, worker
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database
from tests.throwaway import ThrowawayRedis, throwaway_redis

BROKER_DB = 0  # flushed by the broker-loss test: nothing else lives there
BACKEND_DB = 1  # plain Celery's results (the semantic table)
RECORDS_DB = 2  # what the canvas tasks saw
VISIBILITY = 3.0
SWEEP = 1.0


def redis_db(server: ThrowawayRedis, db: int) -> str:
    return server.url.rsplit("/", 1)[0] + f"/{db}"


@dataclass
class CanvasCluster:
    env: dict[str, str]
    app: realapp.TestApp
    workdir: Path
    records: redis.Redis
    workers: list[CeleryProcess] = field(default_factory=list)
    beat: CeleryProcess | None = None

    def add_worker(self, concurrency: int = 2) -> CeleryProcess:
        name = f"cw{len(self.workers)}-{SESSION_TAG}"
        w = worker(self.env, self.app.queues, self.workdir / f"{name}.log", name, concurrency)
        self.workers.append(w)
        return w.wait_ready()

    def recorded(self, tag: str) -> list[Any]:
        key = f"{self.env['PIKKU_T_RECORDS']}:{tag}"
        return [json.loads(v) for v in self.records.lrange(key, 0, -1)]

    def ledger_rows(self, key: str) -> int:
        engine = self.app.pikku.sql_engine
        assert engine is not None
        with engine.connect() as conn:
            count = conn.execute(
                sa.select(sa.func.count()).where(realapp.ledger.c.key == key)
            ).scalar()
        return int(count or 0)

    def logs(self) -> str:
        parts = [f"--- {p.log_path.name}\n{p.log()[-4000:]}" for p in self.workers]
        if self.beat is not None:
            parts.append(f"--- beat\n{self.beat.log()[-2000:]}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def canvas_tables(postgres_url: str) -> str:
    engine = sa.create_engine(postgres_url)
    metadata.create_all(engine)
    realapp.ledger.create(engine, checkfirst=True)
    engine.dispose()
    return postgres_url


@contextmanager
def running_cluster(
    label: str, workdir: Path, canvas_tables: str, server: ThrowawayRedis
) -> Iterator[CanvasCluster]:
    """A beat and one worker on queues and record keys named after ``label``."""
    broker = redis_db(server, BROKER_DB)
    records_url = redis_db(server, RECORDS_DB)
    env = {
        "PIKKU_T_BROKER": broker,
        "PIKKU_T_BACKEND": redis_db(server, BACKEND_DB),
        "PIKKU_T_DATABASE": canvas_tables,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-canvas-{label[:24]}",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": str(SWEEP),
        "PIKKU_T_MARKS": str(workdir),
        "PIKKU_T_EXTRA": "tests.canvas.canvasapp",
        "PIKKU_T_RECORDS": f"{SESSION_TAG}:canvas:{label[:24]}",
        "PIKKU_T_RECORDS_REDIS": records_url,
    }
    app = realapp.build(env)
    records = redis.Redis.from_url(records_url)
    c = CanvasCluster(env, app, workdir, records)
    try:
        c.beat = beat(env, workdir)
        c.add_worker()
        yield c
    finally:
        for w in c.workers:
            w.stop()
        if c.beat is not None:
            c.beat.stop()
        client = redis.Redis.from_url(broker)
        for q in app.queues:
            client.delete(q)
        for key in records.scan_iter(match=f"{env['PIKKU_T_RECORDS']}*", count=1000):
            records.delete(key)
        assert app.pikku.sql_engine is not None
        app.pikku.sql_engine.dispose()


@pytest.fixture
def canvas_cluster(
    request: pytest.FixtureRequest,
    canvas_tables: str,
    tmp_path: Path,
    throwaway_redis_server: ThrowawayRedis,
) -> Iterator[CanvasCluster]:
    with running_cluster(request.node.name, tmp_path, canvas_tables, throwaway_redis_server) as c:
        yield c


@pytest.fixture(scope="session")
def shared_canvas_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanvasCluster]:
    """One cluster (a Redis and a database of its own, a beat, a worker) for
    every test that needs no cluster of its own: each test's keys and records
    are its own. Its beat sweeps only its own database: a second sweep over a
    test cluster's store would re-send that cluster's steps to this broker."""
    workdir = tmp_path_factory.mktemp("shared-canvas")
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_canvas") as url:
        engine = sa.create_engine(url)
        metadata.create_all(engine)
        realapp.ledger.create(engine, checkfirst=True)
        engine.dispose()
        with throwaway_redis() as server, running_cluster("shared", workdir, url, server) as c:
            yield c
