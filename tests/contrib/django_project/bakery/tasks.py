"""Found by Celery's ``app.autodiscover_tasks()`` (an installed app's ``tasks``
module); nothing else imports it."""

from __future__ import annotations

from typing import Any

from pikku_celery import Context
from pikku_celery.contrib.django import get_pikku

from .celery import app

pikku = get_pikku()


@app.task(name="bakery.wrap")
def wrap(loaf: str) -> str:
    return f"wrapped {loaf}"


@pikku.workflow(name="bakery.held_order")
def held_order(ctx: Context) -> Any:
    """Waits for the ``release`` signal, then wraps what it carried."""
    return ctx.step("wrap", wrap, ctx.wait_for_signal("release"))
