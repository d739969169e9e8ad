"""A small order workflow used by the Celery tests: every feature in 5 steps."""

from __future__ import annotations

from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku


def install(app: Celery, pikku: Pikku, counters: dict[str, int] | None = None) -> Any:
    """Register the shop's tasks and workflows on ``app``; return the order workflow."""
    calls = counters if counters is not None else {}

    def bump(name: str) -> int:
        calls[name] = calls.get(name, 0) + 1
        return calls[name]

    @app.task(name="shop.charge", bind=True, shared=False)
    def charge(self: Any, order_id: int, cents: int) -> dict[str, Any]:
        # Fails once, then succeeds: the retry is the step's own.
        if self.request.retries == 0:
            raise self.retry(countdown=0.05, exc=ConnectionError("card network busy"))
        return {"order": order_id, "cents": cents, "request_id": self.request.id}

    @app.task(name="shop.reserve", shared=False)
    def reserve(sku: str) -> str:
        bump(f"reserve:{sku}")
        return f"reserved {sku}"

    app.conf.task_routes = {"shop.label": {"queue": "shipping"}}

    @app.task(name="shop.label", shared=False)
    def label(order_id: int) -> str:
        return f"label-{order_id}"

    @pikku.workflow(name="shop.shipping")
    def shipping(ctx: Context, order_id: int) -> str:
        return str(ctx.step("label", label, order_id))

    @pikku.workflow(name="shop.order")
    def order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        paid = ctx.step("charge", charge, order["id"], order["cents"], retries=2)
        reserved = ctx.gather(
            *(ctx.step_async(f"reserve-{sku}", reserve, sku) for sku in order["skus"])
        )
        ctx.sleep("cooling-off", 0.2)
        shipped = ctx.child("ship", shipping, order["id"])
        return {"paid": paid, "reserved": reserved, "shipped": shipped}

    return order
