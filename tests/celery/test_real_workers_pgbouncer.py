"""The real-worker suite's main cases through PgBouncer in transaction pooling.

Real ``celery worker`` subprocesses (Redis broker) and the test process reach
PostgreSQL only through the session's PgBouncer (:mod:`tests.pgbouncer`),
with ``Pikku(pooler="transaction")``: a run completes and ``wait()`` returns
(by polling: no LISTEN goes through the pooler), a SIGKILLed worker's step
is taken over once its lease lapses; with ``PIKKU_LONG=1`` also a
transactional step killed before its commit leaves no row (PgBouncer rolls
back the server connection of a client that vanished mid-transaction).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus
from tests.helpers import long_form, wait_until
from tests.pgbouncer import PgBouncer
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

from . import realapp
from .test_real_workers import SWEEP, VISIBILITY, Cluster, _broker, tear_down
from .workers import beat

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pooled_database(pgbouncer_server: PgBouncer) -> Iterator[tuple[str, str]]:
    """A database of the module's own on the shared server, its tables made
    directly; (its direct URL, its URL through PgBouncer)."""
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_pgb") as url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(engine)
        realapp.side_effects.create(engine, checkfirst=True)
        realapp.ledger.create(engine, checkfirst=True)
        engine.dispose()
        yield url, pgbouncer_server.url(url)


@pytest.fixture
def cluster(pooled_database: tuple[str, str], tmp_path: Path) -> Iterator[Cluster]:
    """A beat and a worker whose every database connection goes through PgBouncer."""
    broker = _broker("redis")
    env = {
        "PIKKU_T_BROKER": broker.url,
        "PIKKU_T_DATABASE": pooled_database[1],
        "PIKKU_T_POOLER": "transaction",
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-pgb-{tmp_path.name[:20]}",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": str(SWEEP),
        "PIKKU_T_MARKS": str(tmp_path),
        "PIKKU_T_KEYPREFIX": broker.prefix,
    }
    app = realapp.build(env)
    c = Cluster("redis", env, app, tmp_path, broker, [])
    try:
        c.beat = beat(env, tmp_path)
        c.add_worker()
        yield c
    finally:
        tear_down([*c.workers, c.beat], broker, app)


def listens_on(direct_url: str) -> int:
    """Server connections to the database whose last statement was a LISTEN."""
    engine = sa.create_engine(direct_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_five_step_order_completes_and_wait_returns_through_pgbouncer(
    cluster: Cluster, pooled_database: tuple[str, str]
) -> None:
    order = cluster.app.workflows["order"]
    run = order.start({"id": 12, "cents": 500, "skus": ["x", "y"]})
    try:
        output = run.wait(timeout=60)
    except Exception:
        print(cluster.logs())
        raise
    assert output["shipped"] == "label-12"
    assert output["reserved"] == ["reserved x", "reserved y"]
    history = {h.step.name: h for h in run.steps()}
    assert [a.status for a in history["charge"].attempts] == [
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]
    # wait() polled: no LISTEN reached a server connection through the pooler.
    assert listens_on(pooled_database[0]) == 0


def test_a_sigkilled_worker_is_taken_over_through_pgbouncer(cluster: Cluster) -> None:
    run = cluster.app.workflows["takeover"].start("victim")
    wait_until((cluster.workdir / "victim.pid").exists, timeout=30)
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
    assert recovery <= VISIBILITY + SWEEP + 2, recovery


@long_form("the longer PgBouncer case; the default run keeps the main cases")
def test_a_transaction_killed_before_commit_leaves_no_row_through_pgbouncer(
    cluster: Cluster, pooled_database: tuple[str, str]
) -> None:
    key = f"ledger-{SESSION_TAG}-pgb"
    run = cluster.app.workflows["ledger"].start(key)
    wait_until((cluster.workdir / f"{key}.pid").exists, timeout=30)
    victim = int((cluster.workdir / f"{key}.pid").read_text())
    cluster.add_worker()
    cluster.workers[0].kill()  # mid-transaction: PgBouncer must roll its server connection back
    try:
        assert run.wait(timeout=60) == f"booked {key}"
    except Exception:
        print(cluster.logs())
        raise
    engine = sa.create_engine(pooled_database[0], poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            pids = (
                conn.execute(sa.select(realapp.ledger.c.pid).where(realapp.ledger.c.key == key))
                .scalars()
                .all()
            )
    finally:
        engine.dispose()
    assert len(pids) == 1 and pids[0] != victim  # exactly one row, by attempt 2
    (book,) = run.steps()
    assert [a.status for a in book.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
