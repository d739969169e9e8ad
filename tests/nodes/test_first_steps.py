"""pytest-celery's first-steps test, as its documentation writes it, on local nodes.

The setup is the documentation's "Hello, World!": a RabbitMQ broker, a
Redis backend, the built-in worker with the tutorial's ``tasks`` module
added. No Docker: the plugin's nodes are a ``celery worker`` process, a
virtual host of the running RabbitMQ and a key prefix on the running Redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from pytest_celery import (
    CeleryBackendCluster,
    CeleryBrokerCluster,
    CeleryTestSetup,
    RabbitMQTestBroker,
    RedisTestBackend,
)

from tests.nodes.tasks import noop


@pytest.fixture
def celery_broker_cluster(
    celery_rabbitmq_broker: RabbitMQTestBroker,
) -> Iterator[CeleryBrokerCluster]:
    cluster = CeleryBrokerCluster(celery_rabbitmq_broker)
    yield cluster
    cluster.teardown()


@pytest.fixture
def celery_backend_cluster(
    celery_redis_backend: RedisTestBackend,
) -> Iterator[CeleryBackendCluster]:
    cluster = CeleryBackendCluster(celery_redis_backend)
    yield cluster
    cluster.teardown()


@pytest.fixture
def default_worker_tasks(default_worker_tasks: set[ModuleType]) -> set[ModuleType]:
    from tests.nodes import tasks

    default_worker_tasks.add(tasks)
    return default_worker_tasks


def test_hello_world(celery_setup: CeleryTestSetup) -> None:
    assert isinstance(celery_setup.broker, RabbitMQTestBroker)
    assert isinstance(celery_setup.backend, RedisTestBackend)
    assert noop.s().apply_async().get(timeout=30) is None
    celery_setup.worker.wait_for_log("tests.nodes.tasks.noop")
    celery_setup.worker.assert_log_exists("succeeded in")
