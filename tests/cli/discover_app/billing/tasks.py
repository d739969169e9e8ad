"""Found by ``app.autodiscover_tasks``: a task and a workflow on it."""

from __future__ import annotations

from pikku_celery import Context

from ..celery import app, pikku


@app.task(name="billing.invoice", shared=False)
def invoice(cents: int) -> str:
    return f"invoice for {cents}"


@pikku.workflow(name="billing.bill")
def bill(ctx: Context, cents: int) -> str:
    return str(ctx.step("invoice", invoice, cents))


@pikku.workflow(name="billing.approval")
def approval(ctx: Context) -> object:
    return ctx.wait_for_signal("approve")
