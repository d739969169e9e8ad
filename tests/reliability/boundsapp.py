"""Tasks and workflows of the payload-bound tests' real workers
(``PIKKU_T_EXTRA=tests.reliability.boundsapp``; see :mod:`tests.celery.realapp`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku, StepFailedError


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    @app.task(name="t.bounds.sized", shared=False)
    def sized(n: int) -> str:
        return "x" * n

    @pikku.workflow(name="t.bounds.sized")
    def sized_run(ctx: Context, n: int) -> Any:
        try:
            return ctx.step("sized", sized, n, retries=3)
        except StepFailedError as exc:
            return {"refused": str(exc)}

    @pikku.workflow(name="t.bounds.approval")
    def approval(ctx: Context) -> Any:
        first = ctx.wait_for_signal("first")
        return [first, ctx.wait_for_signal("second")]
