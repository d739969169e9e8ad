"""Tasks and a workflow that only Celery's ``include=`` imports."""

from __future__ import annotations

from pikku_celery import Context

from .celery import app, pikku


@app.task(name="include_app.add", shared=False)
def add(a: int, b: int) -> int:
    return a + b


@pikku.workflow(name="include_app.total")
def total(ctx: Context, data: dict[str, int]) -> int:
    first = int(ctx.step("add", add, data["a"], data["b"]))
    return int(ctx.step("double", add, first, first))


@pikku.workflow(name="include_app.approval")
def approval(ctx: Context) -> object:
    return ctx.wait_for_signal("approve")
