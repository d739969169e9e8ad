"""The order workflow, tested the way the shop's developers would.

No broker, no database, no server, no waiting: ``pikku_test_env`` runs the
shop's own Pikku (``example_project.app.pikku``) on an in-memory store and a
clock that skips ahead. The steps run the shop's real Celery tasks, whose
scripted misbehaviour (a busy card network for even order ids, no courier to
Antarctica) drives the paths tested here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from celery.signals import before_task_publish

from example_project.shop.workflows import fulfil_order
from pikku_celery import Pikku, RunHandle
from pikku_celery.testing import WorkflowTestEnv

HOUR = 3600.0


def order(order_id: int, **changes: Any) -> dict[str, Any]:
    """An order as the shop's web app would start it."""
    return {
        "id": order_id,
        "cents": 1999,
        "country": "FI",
        "lines": [{"sku": f"SKU-{order_id}-a", "qty": 1}, {"sku": f"SKU-{order_id}-b", "qty": 2}],
        **changes,
    }


def attempts(run: RunHandle, step: str) -> list[str]:
    """How each attempt of one of the run's steps ended."""
    (history,) = [h for h in run.steps() if h.step.name == step]
    return [str(a.status) for a in history.attempts]


@pytest.fixture(autouse=True)
def no_database(pikku: Pikku) -> Iterator[None]:
    """No test here opens a connection to the shop's database. (Durable
    waits skip on the test clock: each test checks ``env.elapsed``.)"""
    connects: list[object] = []
    assert pikku.sql_engine is not None

    def count(*_: Any) -> None:
        connects.append(_)

    sa.event.listen(pikku.sql_engine, "connect", count)
    yield
    sa.event.remove(pikku.sql_engine, "connect", count)
    assert connects == []


def test_a_busy_card_network_is_retried(pikku_test_env: WorkflowTestEnv) -> None:
    # The card network is busy on the first try of an even order: charge_card
    # reads self.request.retries, which is 0 on attempt 1 and 1 on attempt 2.
    run = fulfil_order.start(order(2))
    assert run.wait()["outcome"] == "shipped"
    assert attempts(run, "charge") == ["failed", "succeeded"]
    (charge,) = [h for h in run.steps() if h.step.name == "charge"]
    assert charge.attempts[0].error is not None
    assert charge.attempts[0].error["type"] == "ConnectionError"
    assert pikku_test_env.elapsed == pytest.approx(0.2 + 0.5)  # retry_delay, then cooling-off


def test_an_hour_of_cooling_off_takes_no_time(pikku_test_env: WorkflowTestEnv) -> None:
    run = fulfil_order.start(order(1, cooling_off=HOUR))
    output = run.wait()
    assert output["outcome"] == "shipped"
    assert output["shipment"] == {
        "parcel": "parcel-1",
        "label": "LBL-00001",
        "courier": "courier booked for order 1",
    }
    assert pikku_test_env.elapsed == pytest.approx(HOUR)
    # The label step went to the 'shipping' queue, as the app's task_routes say.
    child = pikku_test_env.runs()[0]
    assert child.workflow == "shop.ship_order"
    labels = [s for s in pikku_test_env.store.get_steps(child.id) if s.name == "label"]
    assert [s.queue for s in labels] == ["shipping"]


def test_a_large_order_waits_for_approval(pikku_test_env: WorkflowTestEnv, pikku: Pikku) -> None:
    run = fulfil_order.start(order(3, cents=75_000, cooling_off=HOUR, approval_timeout=60))
    pikku_test_env.run_until_waiting(run, "approval")  # past the hour of cooling off
    assert run.status() == "running"
    pikku.send_signal(run.run_id, "approval", {"approved": True, "by": "alice"})
    assert run.wait()["outcome"] == "shipped"
    assert pikku_test_env.elapsed == pytest.approx(HOUR)  # the 60 s timeout never fired


def test_an_approval_sent_before_it_is_asked_for_is_kept(pikku_test_env: WorkflowTestEnv) -> None:
    run = fulfil_order.start(order(5, cents=60_000))
    run.signal("approval", {"approved": False, "by": "bob"})
    output = run.wait()
    assert output == {"outcome": "rejected", "approval": {"approved": False, "by": "bob"}}
    assert attempts(run, "refund") == ["succeeded"]


def test_nobody_approving_rejects_the_order_after_the_timeout(
    pikku_test_env: WorkflowTestEnv,
) -> None:
    run = fulfil_order.start(order(7, cents=80_000, approval_timeout=24 * HOUR))
    output = run.wait()
    assert output == {"outcome": "rejected", "approval": {"approved": False, "by": "timeout"}}
    assert pikku_test_env.elapsed == pytest.approx(0.5 + 24 * HOUR)


def test_no_courier_to_antarctica_refunds_the_charge(
    pikku_test_env: WorkflowTestEnv, pikku: Pikku
) -> None:
    run = fulfil_order.start(order(9, country="AQ"))
    output = run.wait()
    assert output["outcome"] == "refunded"
    assert "no courier delivers to AQ" in output["reason"]
    assert output["refund"]["refunded"] == 1999
    shipping = pikku.handle(pikku_test_env.runs()[0].id)  # the child run, newest
    assert attempts(shipping, "courier") == ["failed"] * 3  # retries=2, 0.1 s apart


def test_nothing_is_sent_to_the_broker(pikku_test_env: WorkflowTestEnv, pikku: Pikku) -> None:
    published: list[object] = []

    def record(**message: object) -> None:
        published.append(message.get("headers"))

    before_task_publish.connect(record, weak=False)
    try:
        fulfil_order.start(order(11)).wait()
    finally:
        before_task_publish.disconnect(record)
    assert pikku_test_env.sent_tasks == []  # no task sent by the shop's code either
    assert published == []  # and Celery published nothing at all
    kinds = {m.kind for m in pikku_test_env.sent}
    assert kinds == {"step", "run"}  # pikku's messages all went to the test queue
