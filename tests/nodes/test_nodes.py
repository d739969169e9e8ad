"""The local nodes behind pytest-celery's API: what a test can do with them.

A worker node is a ``celery worker`` process group: its hostname is the
worker's real node name, ``restart()`` brings up a new process that serves
again, ``kill("SIGSTOP")``/``kill("SIGCONT")`` freeze and thaw it. A Redis
broker node is a key prefix of its own: flushing it loses its messages and
nobody else's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import redis
from pytest_celery import CeleryBrokerCluster, CeleryTestSetup, RedisTestBroker

from pikku_celery.testing.nodes import LocalRedisContainer, LocalWorkerContainer
from tests.nodes.tasks import whoami
from tests.services import REDIS_URL, SESSION_TAG

pytestmark = pytest.mark.slow


@pytest.fixture
def celery_broker_cluster(celery_redis_broker: RedisTestBroker) -> Iterator[CeleryBrokerCluster]:
    cluster = CeleryBrokerCluster(celery_redis_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def default_worker_tasks(default_worker_tasks: set[ModuleType]) -> set[ModuleType]:
    from tests.nodes import tasks

    return default_worker_tasks | {tasks}


def test_the_worker_answers_as_the_node_its_hostname_names(celery_setup: CeleryTestSetup) -> None:
    worker = celery_setup.worker
    assert celery_setup.ready(ping=True, control=True)  # a ping task and a control ping
    replies = celery_setup.app.control.ping(destination=[worker.hostname()], timeout=5)
    assert [next(iter(r)) for r in replies] == [worker.hostname()]
    assert worker.version and worker.worker_queue == "celery"
    assert f"{worker.hostname()} ready." in worker.logs()


def test_a_restarted_worker_is_a_new_process_that_serves_again(
    celery_setup: CeleryTestSetup,
) -> None:
    worker = celery_setup.worker
    before = whoami.s().apply_async().get(timeout=30)
    worker.restart()
    after = whoami.s().apply_async().get(timeout=30)
    assert after != before
    assert worker.logs().count(f"{worker.hostname()} ready.") == 2


def test_a_frozen_worker_serves_nothing_until_thawed(celery_setup: CeleryTestSetup) -> None:
    worker = celery_setup.worker
    worker.kill("SIGSTOP")
    result = whoami.s().apply_async()
    with pytest.raises(Exception, match="timed out"):
        result.get(timeout=2)
    worker.kill("SIGCONT")
    assert result.get(timeout=30) > 0
    assert worker.container.status == "running"


def test_flushing_a_redis_broker_loses_its_messages_only(celery_setup: CeleryTestSetup) -> None:
    broker = celery_setup.broker
    other = LocalRedisContainer(REDIS_URL)
    client = redis.Redis.from_url(REDIS_URL)
    client.set(f"{other.prefix}{SESSION_TAG}", "kept")
    try:
        whoami.s().apply_async(queue="nobody-consumes-this")  # stays queued
        assert any("nobody-consumes-this" in key for key in broker.container.own_keys())
        assert broker.flush() > 0
        assert broker.container.own_keys() == []
        assert other.own_keys() == [f"{other.prefix}{SESSION_TAG}"]
    finally:
        other.teardown()
        client.close()


def test_a_bad_setting_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\npikku_celery_rabbitmq_vhost = mine\n")
    (tmp_path / "test_x.py").write_text(
        textwrap.dedent("""
            def test_x(local_node_settings):
                pass
        """)
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "pikku_celery.testing.pytest_celery"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 4  # pytest's usage error: nothing ran
    assert "pikku_celery_rabbitmq_vhost = 'mine': expected 'auto' or 'url'" in (
        done.stdout + done.stderr
    )


def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    node = LocalWorkerContainer("tests.nodes.no_such_module", log_path=tmp_path / "w.log")
    node.start()
    try:
        with pytest.raises(RuntimeError, match=r"exited \(\d+\) before logging 'ready\.'") as err:
            node.ready(timeout=60)
        assert "no_such_module" in str(err.value)  # the log's tail: celery's own complaint
        assert node.status == "exited"
    finally:
        node.teardown()
