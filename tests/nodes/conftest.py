"""pytest-celery's ``celery_worker`` node fixture, for the tests of this folder;
the suite's services for the plugin's nodes (the store on PostgreSQL), and a
skip locally (a failure in CI) when one is missing.

tests/conftest.py loads ``celery.contrib.pytest``, whose in-process
``celery_worker`` has the same name and would otherwise stand in its place.
"""

from __future__ import annotations

import dataclasses

import pytest
from pytest_celery import celery_worker

from pikku_celery.testing.nodes import LocalRabbitMQContainer, LocalRedisContainer
from pikku_celery.testing.nodes.settings import NodeSettings
from tests.services import AMQP_URL, PG_ADMIN_URL, REDIS_URL, unavailable

__all__ = ["celery_worker"]


@pytest.fixture(autouse=True, scope="session")
def redis_and_rabbitmq() -> None:
    for name, node in (
        ("redis", LocalRedisContainer(REDIS_URL)),
        ("rabbitmq", LocalRabbitMQContainer(AMQP_URL)),
    ):
        try:
            node.ready(timeout=5)
        except ConnectionError as exc:
            unavailable(name, exc)


@pytest.fixture(scope="session")
def local_node_settings(pytestconfig: pytest.Config) -> NodeSettings:
    """The plugin's settings on the suite's servers (``PIKKU_TEST_*``)."""
    settings = NodeSettings.from_config(pytestconfig)
    return dataclasses.replace(
        settings, redis_url=REDIS_URL, amqp_url=AMQP_URL, database=PG_ADMIN_URL
    )
