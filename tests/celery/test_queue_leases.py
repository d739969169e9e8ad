"""A step's lease is ``min(horizon, step_lease)``: the queue's redelivery horizon bounds it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

from pikku_celery import Pikku
from pikku_celery.broker.sqlite import DEFAULT_VISIBILITY_TIMEOUT as SQLITE_BROKER_VISIBILITY
from pikku_celery.celery.queues import (
    AMQP_DEFAULT_LEASE,
    DEFAULT_LEASE,
    DEFAULT_STEP_LEASE,
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
    ("broker", "options", "horizon", "source"),
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
        ("sqlite-queue:////tmp/b.db", {}, SQLITE_BROKER_VISIBILITY, "SQLite broker's default"),
        ("sqlite-queue:////tmp/b.db", {"visibility_timeout": 9}, 9.0, "visibility_timeout"),
        ("memory://", {}, DEFAULT_LEASE, "pikku's default"),
        ("filesystem://", {}, DEFAULT_LEASE, "pikku's default"),
    ],
)
def test_the_horizon_follows_the_transport_and_bounds_the_step_lease(
    broker: str, options: dict[str, Any], horizon: float, source: str
) -> None:
    leases = QueueLeases(_app(broker, broker_transport_options=options))
    lease = leases.lease("jobs")
    assert lease.queue == "jobs"
    assert lease.horizon == horizon
    assert source in lease.horizon_source
    assert lease.step_lease == DEFAULT_STEP_LEASE == 60.0
    assert lease.seconds == min(horizon, 60.0)
    assert lease.renewal == lease.seconds / 2
    assert lease.source == (f"min of {lease.horizon_source} {horizon:g} s and step_lease 60 s")


@pytest.mark.parametrize(
    ("broker", "options", "queues", "horizon"),
    [
        ("redis://127.0.0.1:6379/0", {}, [], 3600.0),
        ("sqs://", {}, [], 1800.0),
        ("amqp://guest@127.0.0.1//", {}, [], 1800.0),
        (
            "amqp://guest@127.0.0.1//",
            {},
            [
                Queue(
                    "jobs", Exchange("jobs"), "jobs", queue_arguments={"x-consumer-timeout": 5_000}
                )
            ],
            5.0,
        ),
        ("sqlite-queue:////tmp/b.db", {}, [], 300.0),
        ("redis://127.0.0.1:6379/0", {"visibility_timeout": 4}, [], 4.0),
    ],
    ids=["redis", "sqs", "rabbitmq", "rabbitmq-x-consumer-timeout", "sqlite-broker", "redis-short"],
)
def test_step_lease_is_the_lease_within_each_brokers_horizon(
    broker: str, options: dict[str, Any], queues: list[Queue], horizon: float
) -> None:
    app = _app(broker, broker_transport_options=options, task_queues=queues or None)
    pikku = Pikku(app, store=InMemoryWorkflowStore(), step_lease=20)
    lease = pikku.lease_for_queue("jobs")
    assert (lease.horizon, lease.step_lease, lease.seconds) == (horizon, 20.0, min(horizon, 20.0))
    assert pikku.dispatcher.lease_ms("jobs") == round(min(horizon, 20.0) * 1000)
    # A countdown is the broker's business: it stays within the horizon, not the lease.
    assert pikku.dispatcher.max_countdown("jobs") == pytest.approx(horizon * 0.9)
    assert pikku.takeover_within("jobs") == lease.seconds + pikku.sweep_interval


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "soon", None, True])
def test_a_step_lease_that_is_not_a_positive_number_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"step_lease must be a positive number of seconds"):
        Pikku(_app("redis://"), store=InMemoryWorkflowStore(), step_lease=bad)


def test_a_max_lease_under_the_step_lease_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_lease .* must be at least step_lease"):
        Pikku(_app("redis://"), store=InMemoryWorkflowStore(), step_lease=30, max_lease=10)


def test_the_fleet_bound_is_twice_the_longest_horizon_and_never_under_step_lease() -> None:
    redis = Pikku(_app("redis://"), store=InMemoryWorkflowStore())
    assert redis.lease_bound_ms() == 2 * 3600 * 1000  # an older release leased the horizon
    short = _app("redis://", broker_transport_options={"visibility_timeout": 6})
    assert Pikku(short, store=InMemoryWorkflowStore()).lease_bound_ms() == 2 * 60 * 1000
    fixed = Pikku(_app("redis://"), store=InMemoryWorkflowStore(), max_lease=600)
    assert fixed.lease_bound_ms() == 600_000


def test_the_pikku_override_is_the_queues_horizon_and_a_default_applies_elsewhere() -> None:
    app = _app("redis://127.0.0.1:6379/0", broker_transport_options={"visibility_timeout": 45})
    leases = QueueLeases(app, overrides={"reports": 900, "quick": 10}, default=30)
    assert (leases.lease("reports").horizon, leases.lease("reports").seconds) == (900, 60)
    assert leases.lease("reports").horizon_source == "pikku queue_leases"
    assert leases.lease("quick").seconds == 10
    assert leases.lease("other").seconds == 45  # the transport still knows its horizon
    memory = QueueLeases(_app("memory://"), default=30)
    assert (
        memory.lease("x").seconds == 30
        and memory.lease("x").horizon_source == "pikku default_lease"
    )


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
