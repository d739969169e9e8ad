"""A small Pikku for the integration tests: memory broker, in-memory store.

Starting a run takes its first pass inline and publishes the step's message
to the memory broker, where nothing consumes it; :func:`run_scheduled_steps`
plays the worker, so a test can take a run to its end without one.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku
from pikku_celery.engine import call_with
from pikku_celery.store import InMemoryWorkflowStore, StepKind, StepStatus

ORDER = "contrib.order"
FLAKY = "contrib.flaky"


def make_pikku(name: str = "contrib") -> Pikku:
    """A fresh Celery app and Pikku with two workflows: ``contrib.order`` and ``contrib.flaky``."""
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "celery"
    pikku = Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)

    @app.task(name="contrib.add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="contrib.explode", shared=False)
    def explode() -> None:
        raise RuntimeError("the courier exploded")

    @pikku.workflow(name=ORDER)
    def order(ctx: Context, data: dict[str, Any]) -> dict[str, Any]:
        total = ctx.step("add", add, data["a"], data["b"])
        approval = ctx.wait_for_signal("approval")
        return {"total": total, "approval": approval}

    @pikku.workflow(name=FLAKY)
    def flaky(ctx: Context) -> None:
        ctx.step("explode", explode)

    return pikku


def run_scheduled_steps(pikku: Pikku, run_id: str) -> int:
    """Run every scheduled task step of the run here, as a worker would."""
    done = 0
    for step in pikku.store.get_steps(run_id):
        if step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
            assert step.task_name is not None
            task = pikku.app.tasks[step.task_name]
            pikku.execute_step(run_id, step.id, step.task_name, call_with(task.run), step.queue)
            done += 1
    return done


celery_app = Celery("contrib-settings", broker="memory://", set_as_current=False)
"""A bare Celery app for ``PIKKU_CELERY['CELERY_APP']`` in the Django tests."""

shop = make_pikku("contrib-shop")
"""The Pikku the Django tests name in ``PIKKU_CELERY['PIKKU']``."""
