"""A step's lease is the redelivery horizon of the queue it travels through."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

from pikku_celery import Pikku
from pikku_celery.celery.queues import (
    AMQP_DEFAULT_LEASE,
    DEFAULT_LEASE,
    REDIS_DEFAULT_VISIBILITY,
    SQS_DEFAULT_VISIBILITY,
    QueueLeases,
)
from pikku_celery.store import InMemoryWorkflowStore


def _app(broker: str, **conf: Any) -> Celery:
    app = Celery("leases", broker=broker, set_as_current=False)
    app.conf.update(conf)
    return app


@pytest.mark.parametrize(
    ("broker", "options", "seconds", "source"),
    [
        ("redis://127.0.0.1:6379/0", {}, REDIS_DEFAULT_VISIBILITY, "kombu's Redis default"),
        (
            "redis://127.0.0.1:6379/0",
            {"visibility_timeout": 42},
            42.0,
            "broker_transport_options['visibility_timeout']",
        ),
        ("rediss://h:6380/0", {"visibility_timeout": 7.5}, 7.5, "broker_transport_options"),
        ("sentinel://h:26379", {}, REDIS_DEFAULT_VISIBILITY, "kombu's Redis default"),
        ("sqs://", {}, SQS_DEFAULT_VISIBILITY, "kombu's SQS default"),
        ("sqs://", {"visibility_timeout": 120}, 120.0, "visibility_timeout"),
        ("amqp://guest@127.0.0.1//", {}, AMQP_DEFAULT_LEASE, "consumer_timeout"),
        ("pyamqp://guest@127.0.0.1//", {}, AMQP_DEFAULT_LEASE, "consumer_timeout"),
        ("sqlite-queue:////tmp/b.db", {"visibility_timeout": 9}, 9.0, "visibility_timeout"),
        ("memory://", {}, DEFAULT_LEASE, "pikku's default"),
        ("filesystem://", {}, DEFAULT_LEASE, "pikku's default"),
    ],
)
def test_lease_follows_the_transport(
    broker: str, options: dict[str, Any], seconds: float, source: str
) -> None:
    leases = QueueLeases(_app(broker, broker_transport_options=options))
    lease = leases.lease("jobs")
    assert lease.seconds == seconds
    assert source in lease.source
    assert lease.queue == "jobs"


def test_a_rabbitmq_queue_argument_sets_its_lease() -> None:
    app = _app(
        "amqp://guest@127.0.0.1//",
        task_queues=[
            Queue(
                "slow", Exchange("slow"), "slow", queue_arguments={"x-consumer-timeout": 900_000}
            ),
            Queue("fast", Exchange("fast"), "fast"),
        ],
    )
    leases = QueueLeases(app)
    assert leases.lease("slow").seconds == 900.0
    assert leases.lease("slow").source == "task_queues x-consumer-timeout"
    assert leases.lease("fast").seconds == AMQP_DEFAULT_LEASE
    assert {q.queue for q in leases.table()} >= {"slow", "fast", "celery"}


def test_the_pikku_override_wins_and_a_default_lease_applies_elsewhere() -> None:
    app = _app("redis://127.0.0.1:6379/0", broker_transport_options={"visibility_timeout": 60})
    leases = QueueLeases(app, overrides={"reports": 900}, default=30)
    assert leases.lease("reports").seconds == 900
    assert leases.lease("reports").source == "pikku queue_leases"
    assert leases.lease("other").seconds == 60  # the transport still knows its horizon
    memory = QueueLeases(_app("memory://"), default=30)
    assert memory.lease("x").seconds == 30 and memory.lease("x").source == "pikku default_lease"


def test_the_default_queue_is_used_when_none_is_named() -> None:
    app = _app(
        "redis://", task_default_queue="work", broker_transport_options={"visibility_timeout": 5}
    )
    pikku = Pikku(app, store=InMemoryWorkflowStore())
    assert pikku.lease_for_queue().queue == "work"
    assert pikku.lease_for_queue(None).seconds == 5


def test_a_lease_under_two_seconds_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    app = _app("redis://", broker_transport_options={"visibility_timeout": 1.5})
    leases = QueueLeases(app)
    with caplog.at_level(logging.WARNING):
        assert leases.lease("q").seconds == 1.5
        leases.lease("q")
        leases.lease("q")
    warned = [r for r in caplog.records if "under 2 s" in r.getMessage()]
    assert len(warned) == 1
    assert "visibility timeout" in warned[0].getMessage()


def test_a_lease_is_resolved_once_and_cached() -> None:
    app = _app("redis://", broker_transport_options={"visibility_timeout": 10})
    leases = QueueLeases(app)
    first = leases.lease("q")
    app.conf.broker_transport_options = {"visibility_timeout": 99}
    assert leases.lease("q") is first
