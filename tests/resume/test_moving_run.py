"""A run whose worker is SIGKILLed half-way moves to another process, which
replays the body once and resumes it from there: each step once, the same
output as an uninterrupted run (real ``celery worker`` processes, Redis,
PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pikku_celery.store import AttemptStatus
from tests.celery.test_eager_workers import Cluster, cluster_of, dispatches, ledger_keys, waited
from tests.celery.test_real_workers import pg_tables  # noqa: F401 - a fixture
from tests.celery.workers import CeleryProcess
from tests.helpers import wait_until

from . import moveapp

pytestmark = pytest.mark.slow


class MoveProcess(CeleryProcess):
    app_module = "tests.resume.moveapp"


class MoveCluster(Cluster):
    process = MoveProcess
    prefix = "m"


@pytest.fixture
def cluster(pg_tables: str, tmp_path: Path) -> Iterator[MoveCluster]:  # noqa: F811
    yield from cluster_of(MoveCluster, moveapp.build, "redis", pg_tables, tmp_path, "resume-moving")


def test_a_run_moved_by_a_sigkill_replays_once_and_ends_as_an_uninterrupted_one(
    cluster: MoveCluster,
) -> None:
    cluster.start_beat()
    cluster.add_worker()
    moving = cluster.app.workflows["moving"]
    steady_key, moved_key = "steady", "moved"
    (cluster.workdir / f"{steady_key}.pid").write_text("0")  # its hang step returns at once
    steady = moving.start(steady_key)
    expected = waited(cluster, steady)

    moved = moving.start(moved_key)
    wait_until((cluster.workdir / f"{moved_key}.pid").exists, timeout=30)  # half-way, hanging
    cluster.add_worker()
    cluster.workers[0].kill()
    assert waited(cluster, moved) == expected == 2 * moveapp.HALF + 1

    for key in (steady_key, moved_key):  # each step's row once
        steps = sorted(f"{key}:{p}{i}" for p in "ab" for i in range(moveapp.HALF))
        assert ledger_keys(cluster, key) == steps
    seen = dispatches(moved)
    assert all(
        [status for _, status in attempts] == [AttemptStatus.SUCCEEDED]
        for name, attempts in seen.items()
        if name != "hang"
    ), seen
    assert seen["hang"][-1][1] == AttemptStatus.SUCCEEDED
    # Without resuming, every pass (one per step) would start the body again.
    for key in (steady_key, moved_key):
        starts = (cluster.workdir / f"{key}.bodies").read_text().split()
        assert len(starts) < moveapp.HALF, (key, starts)
    moved_starts = (cluster.workdir / f"{moved_key}.bodies").read_text().split()
    # The starting process (a run's first pass), the first worker's, the second's.
    assert len(set(moved_starts)) == 3, moved_starts
