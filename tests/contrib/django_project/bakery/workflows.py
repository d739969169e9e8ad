"""The bakery's workflow, on the project's Pikku taken at import time."""

from __future__ import annotations

from typing import Any

from pikku_celery import Context
from pikku_celery.contrib.django import get_pikku

from .celery import app

pikku = get_pikku()  # at import: before the test runner makes the test database


@app.task(name="bakery.bake")
def bake(cents: int) -> str:
    return f"loaf for {cents}"


@pikku.workflow(name="bakery.order")
def bake_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    return {"order": order["id"], "loaf": ctx.step("bake", bake, order["cents"])}


@pikku.workflow(name="bakery.approval")
def approval(ctx: Context) -> Any:
    """Ends with the payload of the ``approve`` signal."""
    return ctx.wait_for_signal("approve")
