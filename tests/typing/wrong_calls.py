"""Wrong uses of the typed public API: mypy must report each, on its line.

Every line that ends in ``# expect: CODE[, CODE]`` must get exactly those
error codes, and no other line any error (tests/typing/test_mypy.py). The
project's own mypy run excludes this file; it is never imported or run.
"""

from __future__ import annotations

from typing import Any

from example_project.app import pikku
from example_project.shop.workflows import fulfil_order, ship_order
from pikku_celery import Context
from pikku_celery.testing import WorkflowTestEnv

ORDER: dict[str, Any] = {"id": 1, "cents": 1999, "country": "FI", "lines": []}


def starting() -> None:
    """The shop's fulfil_order takes an order dict and returns a dict."""
    fulfil_order.start("x")  # expect: arg-type
    fulfil_order.start()  # expect: call-arg
    fulfil_order.start(ORDER, "order-1")  # expect: call-arg
    pikku.start(fulfil_order, 3)  # expect: misc
    pikku.start(fulfil_order)  # expect: arg-type


def using_the_output() -> str:
    """``result()`` and ``wait()`` are typed as the workflow's return type."""
    fulfil_order.start(ORDER).wait().upper()  # expect: attr-defined
    outcome: str = fulfil_order.start(ORDER).result()  # expect: assignment
    return outcome


def no_input() -> None:
    """A workflow without an input parameter takes none."""

    @pikku.workflow(name="typing.tick")
    def tick(ctx: Context) -> int:
        return 1

    tick.start(ORDER)  # expect: call-overload
    tick.start().result().upper()  # expect: attr-defined


def inside_a_body() -> None:
    """A child workflow's input and output are checked, as ``start``'s are."""

    @pikku.workflow(name="typing.parent")
    def parent(ctx: Context, order: dict[str, Any]) -> int:
        ctx.child("ship", ship_order, "x")  # expect: misc
        ctx.child("ship-2", ship_order)  # expect: arg-type
        shipped: int = ctx.child("ship-3", ship_order, order)  # expect: assignment
        handle = ctx.child_async("ship-4", ship_order, order)
        ctx.gather(handle)[0] + 1  # expect: operator
        ctx.gather(handle, return_exceptions=True)[0].get("parcel")  # expect: union-attr
        return shipped


def stand_in_tasks(env: WorkflowTestEnv) -> None:
    """``env.task`` keeps the function's signature: calls are checked."""

    @env.task
    def charge(order_id: int, cents: int) -> str:
        return f"charged {cents}"

    @env.task(name="shop.label")
    def label(order_id: int) -> dict[str, int]:
        return {"label": order_id}

    charge("1", 2)  # expect: arg-type
    charge(1)  # expect: call-arg
    label(1).upper()  # expect: attr-defined
