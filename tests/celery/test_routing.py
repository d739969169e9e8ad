"""A step's message takes its task's whole route, on a real RabbitMQ topic exchange.

``task_routes`` by exchange and routing key, and ``ctx.step``'s ``queue`` /
``exchange`` / ``routing_key`` / ``priority``, route the step's message as
``apply_async`` would route the task's own; those options never reach the
task. The queue the message lands on (found through ``task_queues``'
bindings) gives the step its lease, and Celery's tools see the task's name.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from kombu import Connection, Exchange, Queue
from kombu.simple import SimpleQueue

from pikku_celery import Context, Pikku
from pikku_celery.celery.routes import routed_queue, topic_matches
from pikku_celery.cli import main as cli
from pikku_celery.store import InMemoryWorkflowStore
from tests.services import AMQP_URL, unavailable


@dataclass
class Bakery:
    app: Celery
    pikku: Pikku
    ovens: Queue
    default: Queue
    exchange: str
    conn: Connection


@pytest.fixture
def bakery() -> Iterator[Bakery]:
    tag = f"pikku-route-{uuid.uuid4().hex[:8]}"
    exchange = Exchange(f"{tag}-bakery", type="topic")
    ovens = Queue(
        f"{tag}-ovens",
        exchange,
        routing_key="ovens.*",
        queue_arguments={"x-consumer-timeout": 600_000},
    )
    default = Queue(f"{tag}-celery")
    app = Celery("bakery", broker=AMQP_URL, set_as_current=False)
    app.conf.update(
        task_queues=[ovens, default],
        task_default_queue=default.name,
        task_routes={"shop.slow_hot": {"exchange": exchange.name, "routing_key": "ovens.slow"}},
    )

    @app.task(name="shop.slow_hot", shared=False)
    def slow_hot(n: int) -> int:
        return n

    @app.task(name="shop.plain", shared=False)
    def plain(n: int) -> int:
        return n

    pikku = Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)
    try:
        conn = Connection(AMQP_URL, connect_timeout=5)
        conn.ensure_connection(max_retries=1)
    except Exception as exc:
        unavailable("RabbitMQ", exc)
    for queue in (ovens, default):
        queue(conn.default_channel).declare()
    try:
        yield Bakery(app, pikku, ovens, default, exchange.name, conn)
    finally:
        for queue in (ovens, default):
            queue(conn.default_channel).delete()
        exchange(conn.default_channel).delete()
        conn.release()


def received(bakery: Bakery, queue: Queue) -> Any:
    """The next message on ``queue`` (waiting up to 10 s), acknowledged."""
    simple = SimpleQueue(bakery.conn.default_channel, queue)
    try:
        message = simple.get(block=True, timeout=10)
        message.ack()
    finally:
        simple.close()
    return message


def test_a_task_routed_by_exchange_and_routing_key_keeps_its_route(bakery: Bakery) -> None:
    @bakery.pikku.workflow(name="bakery.bake")
    def bake(ctx: Context) -> Any:
        return ctx.step("bake", "shop.slow_hot", 1)

    run = bake.start()
    [step] = bakery.pikku.store.get_steps(run.run_id)
    assert step.queue == bakery.ovens.name  # found through the topic binding
    message = received(bakery, bakery.ovens)
    assert message.headers["task"] == "pikku.run_step"
    assert message.headers["shadow"] == "shop.slow_hot"  # what Celery's tools show
    assert message.delivery_info["exchange"] == bakery.exchange
    assert message.delivery_info["routing_key"] == "ovens.slow"
    lease = bakery.pikku.lease_for_queue(step.queue)
    assert lease.horizon == 600.0 and "x-consumer-timeout" in lease.horizon_source
    assert lease.seconds == min(600.0, bakery.pikku.step_lease)


def test_routing_options_of_ctx_step_route_and_never_reach_the_task(bakery: Bakery) -> None:
    @bakery.pikku.workflow(name="bakery.hot")
    def hot(ctx: Context) -> Any:
        return ctx.step(
            "hot", "shop.plain", 2, exchange=bakery.exchange, routing_key="ovens.hot", priority=3
        )

    run = hot.start()
    [step] = bakery.pikku.store.get_steps(run.run_id)
    assert step.args == [2] and step.kwargs == {}
    assert step.queue == bakery.ovens.name
    assert step.route == {"exchange": bakery.exchange, "routing_key": "ovens.hot", "priority": 3}
    first = received(bakery, bakery.ovens)
    assert first.delivery_info["routing_key"] == "ovens.hot"
    assert first.properties["priority"] == 3
    bakery.pikku.dispatcher.send_step(step)  # what the sweep sends again takes the route too
    again = received(bakery, bakery.ovens)
    assert again.delivery_info["routing_key"] == "ovens.hot" and again.headers["shadow"] == (
        "shop.plain"
    )


def test_leases_lists_a_task_under_the_queue_its_route_reaches(
    bakery: Bakery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"bakery_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("pikku = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        imported = __import__(module)
        imported.pikku = bakery.pikku
        result = CliRunner().invoke(cli, ["-A", f"{module}:pikku", "leases", "--json"])
    finally:
        sys.modules.pop(module, None)
    assert result.exit_code == 0, result.output
    import json

    queues = {q["queue"]: q for q in json.loads(result.output)["queues"]}
    assert "shop.slow_hot" in queues[bakery.ovens.name]["tasks"]
    assert queues[bakery.ovens.name]["horizon"] == 600.0
    assert "shop.slow_hot" not in queues[bakery.default.name]["tasks"]


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("ovens.*", "ovens.slow", True),
        ("ovens.*", "ovens.slow.left", False),
        ("ovens.#", "ovens.slow.left", True),
        ("ovens.#", "ovens", True),
        ("#", "anything.at.all", True),
        ("*.slow", "ovens.slow", True),
        ("*.slow", "slow", False),
        ("ovens.slow", "ovens.hot", False),
    ],
)
def test_topic_bindings_match_as_rabbitmq_matches_them(
    pattern: str, key: str, matches: bool
) -> None:
    assert topic_matches(pattern, key) is matches


def test_a_route_no_binding_matches_names_no_queue() -> None:
    ovens = Queue("ovens", Exchange("bakery", type="direct"), routing_key="ovens.slow")
    assert routed_queue([ovens], {"exchange": "bakery", "routing_key": "ovens.hot"}) is None
    assert routed_queue([ovens], {"exchange": "bakery", "routing_key": "ovens.slow"}) == "ovens"
    assert routed_queue([ovens], {"queue": "shipping"}) == "shipping"
    # an exchange other than the queue's own routes past the queue
    assert routed_queue([ovens], {"queue": "shipping", "exchange": "bakery"}) is None


def test_a_task_s_own_queue_routes_its_steps_as_apply_async_routes_the_task() -> None:
    app = Celery("own-queue", broker="memory://", set_as_current=False)

    @app.task(name="own.bake", shared=False, queue="ovens")
    def bake() -> None: ...

    @app.task(name="own.box", shared=False)
    def box() -> None: ...

    pikku = Pikku(
        app,
        store=InMemoryWorkflowStore(),
        queue_leases={"ovens": 120, "celery": 30},
        step_lease=300,
        install_beat=False,
    )
    assert pikku.dispatcher.task_queue("own.bake") == "ovens"
    assert pikku.dispatcher.lease_ms(pikku.dispatcher.task_queue("own.bake")) == 120_000
    # ctx.step's queue= still wins, as apply_async(queue=...) does over the task's
    assert pikku.dispatcher.task_queue("own.bake", {"queue": "celery"}) == "celery"
    assert pikku.dispatcher.task_queue("own.box") == "celery"
