"""The shop's order workflow on real Celery workers, with pytest-celery's setup API.

No Docker: pikku-celery's plugin (``-p pikku_celery.testing.pytest_celery``
in pytest's ``addopts``) makes pytest-celery's nodes out of local
``celery worker`` processes, a key prefix on the Redis that is already
running, and a scratch database for the store. ``celery_setup_pikku`` is a
Pikku on the setup's app with that store; the installers named below put the
shop's workflows on it, here and in every worker node, and
``default_worker_tasks`` gives the workers the shop's (shared) tasks.

One order's parcel packer hangs on its first attempt (the shop's scripted
misbehaviour); the test SIGKILLs the worker node running it, and the
cluster's other node finishes the order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pytest_celery import (
    CeleryBrokerCluster,
    CeleryTestSetup,
    CeleryTestWorker,
    CeleryWorkerCluster,
    RedisTestBroker,
)

from pikku_celery import Pikku

pytestmark = pytest.mark.slow


@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Iterator[CeleryBrokerCluster]:
    cluster = CeleryBrokerCluster(celery_redis_broker)  # Redis only, not the whole matrix
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_worker_cluster(
    celery_worker: CeleryTestWorker, celery_worker_node_factory: Callable[..., CeleryTestWorker]
) -> Iterator[CeleryWorkerCluster]:
    cluster = CeleryWorkerCluster(celery_worker, celery_worker_node_factory())  # two nodes
    yield cluster
    cluster.teardown()


@pytest.fixture
def default_worker_tasks(default_worker_tasks: set[ModuleType]) -> set[ModuleType]:
    import example_project.app as shop  # the shop's app module imports its tasks

    return default_worker_tasks | {shop}


@pytest.fixture
def celery_setup_pikku_installers() -> list[str]:
    return ["example_project.shop.workflows:install"]


@pytest.fixture
def local_worker_options(local_worker_options: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    # The shop keeps its files (the hung packer's pid mark) under PIKKU_DEMO_HOME.
    return {**local_worker_options, "env": {"PIKKU_DEMO_HOME": str(tmp_path)}}


def test_an_order_survives_its_worker_being_killed(
    celery_setup: CeleryTestSetup, celery_setup_pikku: Pikku, tmp_path: Path
) -> None:
    order = {
        "id": 3,
        "cents": 1999,
        "country": "FI",
        "lines": [{"sku": "SKU-3-a", "qty": 1}],
        "cooling_off": 0.1,
        "kill_order": 3,  # its packer hangs on attempt 1
    }
    run = celery_setup_pikku.start("shop.fulfil_order", order)

    packer = int(wait_for_text(tmp_path / "kill-me.pid", timeout=60))  # the hung packer's pid
    [victim] = [node for node in celery_setup.worker_cluster if packer in pids(node)]
    victim.kill()  # SIGKILL, mid-step
    assert victim.container.status == "exited"

    assert run.wait(timeout=90)["outcome"] == "shipped"
    ship = next(h for h in run.steps() if h.step.name == "ship")
    assert ship.step.child_run_id is not None
    shipping = celery_setup_pikku.handle(ship.step.child_run_id)
    pack = next(h for h in shipping.steps() if h.step.name == "pack")
    assert [str(a.status) for a in pack.attempts] == ["superseded", "succeeded"]
    [survivor] = [node for node in celery_setup.worker_cluster if node is not victim]
    survivor.assert_log_exists("shop.pack_parcel")


def pids(node: CeleryTestWorker) -> set[int]:
    """The node's processes: the worker and its pool."""
    return {int(p["pid"]) for p in node.get_running_processes_info(["pid"])}


def wait_for_text(path: Path, timeout: float) -> str:
    """The file's text once it has some; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)  # polling, with a deadline
    return path.read_text()
