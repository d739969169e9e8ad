"""The order workflow: plain Python, replayed from the database after any crash."""

from __future__ import annotations

from typing import Any

from example_project.app import pikku
from example_project.shop.tasks import (
    book_courier,
    charge_card,
    create_label,
    pack_parcel,
    refund,
    reserve_stock,
)
from pikku_celery import Context, Pikku, SignalTimeoutError, StepFailedError

LARGE_ORDER_CENTS = 50_000


@pikku.workflow(name="shop.ship_order")
def ship_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    """Shipping, as a child workflow of its own."""
    # retries=2: a worker lost mid-step is taken over as the next attempt.
    parcel = ctx.step("pack", pack_parcel, order["id"], order.get("kill_order", -1), retries=2)
    label = ctx.step("label", create_label, order["id"])
    courier = ctx.step(
        "courier", book_courier, order["id"], order["country"], retries=2, retry_delay=0.1
    )
    return {"parcel": parcel, "label": label, "courier": courier}


@pikku.workflow(name="shop.fulfil_order")
def fulfil_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    """Charge, reserve, cool off, get approval if large, ship; refund if shipping fails."""
    charge = ctx.step(
        "charge",
        charge_card,
        order["id"],
        order["cents"],
        ctx.idempotency_key("charge"),
        retries=3,
        retry_delay=0.2,
        backoff=2,
    )
    reserved = ctx.gather(
        *(
            ctx.step_async(
                f"reserve:{line['sku']}", reserve_stock, order["id"], line["sku"], line["qty"]
            )
            for line in order["lines"]
        )
    )
    ctx.sleep("cooling-off", order.get("cooling_off", 0.5))
    if order["cents"] >= LARGE_ORDER_CENTS:
        try:
            approval = ctx.wait_for_signal("approval", timeout=order.get("approval_timeout", 3))
        except SignalTimeoutError:
            approval = {"approved": False, "by": "timeout"}
        if not approval.get("approved"):
            ctx.step("refund", refund, order["id"], charge["charge_id"], order["cents"])
            return {"outcome": "rejected", "approval": approval}
    try:
        shipment = ctx.child("ship", ship_order, order)
    except StepFailedError as exc:
        refunded = ctx.step("refund", refund, order["id"], charge["charge_id"], order["cents"])
        return {"outcome": "refunded", "reason": exc.message, "refund": refunded}
    return {"outcome": "shipped", "reserved": len(reserved), "shipment": shipment}


def install(other: Pikku) -> None:
    """Register the shop's workflows on another Pikku too: a test's, whose
    workers run them (see ``tests/test_on_workers.py``)."""
    for workflow in (ship_order, fulfil_order):
        other.workflow(workflow.fn, name=workflow.name)
