"""continue_as_new on real ``celery worker`` processes (Redis, PostgreSQL): a
worker SIGKILLed before a continuing pass commits, and one SIGKILLed right
after it commits (nothing published, its message redelivered), still start
each successor exactly once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from pikku_celery.engine.continuing import successor_id
from pikku_celery.store import RunStatus
from tests.celery.test_eager_workers import Cluster, cluster_of, ledger_keys, waited
from tests.celery.test_real_workers import pg_tables  # noqa: F401 - a fixture
from tests.celery.workers import CeleryProcess
from tests.helpers import wait_until

from . import canapp

pytestmark = pytest.mark.slow


class CanProcess(CeleryProcess):
    app_module = "tests.continue_as_new.canapp"


class CanCluster(Cluster):
    process = CanProcess
    prefix = "c"


@pytest.fixture
def cluster(pg_tables: str, tmp_path: Path) -> Iterator[CanCluster]:  # noqa: F811
    yield from cluster_of(
        CanCluster,
        canapp.build,
        "redis",
        pg_tables,
        tmp_path,
        "continue-as-new",
        PIKKU_T_KILL_CONTINUE="1",
    )


def test_sigkills_around_a_continuation_start_each_successor_once(cluster: CanCluster) -> None:
    cluster.start_beat()
    cluster.add_worker()
    key = "rolling"
    first = cluster.app.workflows["rolling"].start({"key": key, "round": 0, "x": 0})
    wait_until((cluster.workdir / f"{key}.pid").exists, timeout=30)  # round 0 hangs
    cluster.add_worker()
    cluster.workers[0].kill()  # before round 0's continuing pass: its step moves

    assert waited(cluster, first, timeout=90) == canapp.ROUNDS + 1  # one per round, + hang
    assert (cluster.workdir / canapp.KILLED_MARK).exists()  # a pass died after its commit

    store = cluster.app.pikku.store
    runs = store.list_runs(workflow="c.rolling")
    assert len(runs) == canapp.ROUNDS  # each successor once
    chain = [first.run_id]
    for _ in range(canapp.ROUNDS - 1):
        chain.append(successor_id(chain[-1]))
    assert sorted(r.id for r in runs) == sorted(chain)
    for before, after in itertools.pairwise(chain):
        ended, next_run = store.get_run(before), store.get_run(after)
        assert ended is not None and next_run is not None
        assert ended.status == RunStatus.COMPLETED and ended.continued_as == after
        assert next_run.continued_from == before
    assert ledger_keys(cluster, key) == [f"{key}:{r}:a" for r in range(canapp.ROUNDS)]
    assert first.latest().run_id == chain[-1]
