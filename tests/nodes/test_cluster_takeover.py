"""A worker node SIGKILLed mid-step: attempt 2 completes on the cluster's other node.

pytest-celery's API throughout: a :class:`~pytest_celery.CeleryWorkerCluster`
of two local worker nodes, a node killed with ``node.kill()``; the Pikku is
the plugin's ``celery_setup_pikku`` (the setup's app, a scratch store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytest_celery import CeleryTestSetup, CeleryTestWorker, CeleryWorkerCluster

from pikku_celery import Pikku
from pikku_celery.store import AttemptStatus
from pikku_celery.testing.nodes.api import LocalTestWorker
from tests.helpers import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def celery_setup_pikku_installers() -> list[str]:
    return ["tests.nodes.workflows:install"]


@pytest.fixture
def celery_worker_cluster(
    celery_worker: CeleryTestWorker, celery_worker_node_factory: Callable[..., LocalTestWorker]
) -> Iterator[CeleryWorkerCluster]:
    cluster = CeleryWorkerCluster(celery_worker, celery_worker_node_factory())
    yield cluster
    cluster.teardown()


def pids(node: LocalTestWorker) -> set[int]:
    return {int(p["pid"]) for p in node.get_running_processes_info(["pid"])}


def test_a_node_killed_mid_step_is_taken_over_by_the_other_node(
    celery_setup: CeleryTestSetup, celery_setup_pikku: Pikku, tmp_path: Path
) -> None:
    cluster = celery_setup.worker_cluster
    assert len(cluster) == 2
    run = celery_setup_pikku.start("nodes.takeover", {"marks": str(tmp_path), "key": "victim"})
    mark = tmp_path / "victim.pid"
    wait_until(lambda: mark.exists() and mark.read_text(), timeout=60)
    running = int(mark.read_text())
    [victim] = [node for node in cluster if running in pids(node)]
    [survivor] = [node for node in cluster if node is not victim]
    survivor_pids = pids(survivor)

    victim.kill()  # SIGKILL, the node's default: its pool process dies mid-step
    assert victim.container.status == "exited"

    assert run.wait(timeout=90) in survivor_pids
    (hang,) = run.steps()
    assert hang.step.attempt == 2
    assert [a.status for a in hang.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
    assert hang.attempts[0].result is None
    # Each attempt names its worker process (host:pid): the second is the survivor's.
    assert int(str(hang.attempts[1].worker).rsplit(":", 1)[1]) in survivor_pids
    survivor.assert_log_exists("nodes.hang_first")
