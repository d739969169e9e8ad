"""Correct use of the typed public API: mypy --strict must find nothing here.

Checked by the project's own mypy run and by test_mypy.py; never imported or
run (the workflows are defined inside functions, so nothing is registered).
"""

from __future__ import annotations

from typing import Any, assert_type

from example_project.app import pikku
from example_project.shop.tasks import charge_card
from example_project.shop.workflows import fulfil_order, ship_order
from pikku_celery import Context, RunHandle, StepFailedError, StepHandle, Workflow
from pikku_celery.testing import WorkflowTestEnv

ORDER: dict[str, Any] = {"id": 1, "cents": 1999, "country": "FI", "lines": []}


def starting_the_shops_workflow() -> None:
    """``In`` and ``Out`` come from the workflow function's signature."""
    assert_type(fulfil_order, Workflow[dict[str, Any], dict[str, Any]])
    run = fulfil_order.start(ORDER, idempotency_key="order-1")
    assert_type(run, RunHandle[dict[str, Any]])
    assert_type(run.wait(timeout=5), dict[str, Any])
    assert_type(run.result(), dict[str, Any])
    assert_type(pikku.start(fulfil_order, ORDER), RunHandle[dict[str, Any]])
    # By name or by id the types are not known.
    assert_type(pikku.start("shop.fulfil_order", ORDER), RunHandle[Any])
    assert_type(pikku.handle(run.run_id), RunHandle[Any])


def bare_annotations_still_mean_any(run: RunHandle, workflow: Workflow, step: StepHandle) -> None:
    """Un-parametrised names are ``[Any]`` (type parameter defaults), as before."""
    assert_type(run, RunHandle[Any])
    assert_type(workflow, Workflow[Any, Any])
    assert_type(step, StepHandle[Any])
    workflow.start(1)
    workflow.start()


def a_handle_is_covariant(run: RunHandle[dict[str, Any]]) -> RunHandle[object]:
    """A handle of a narrower output is one of a wider output."""
    return run


def workflows_without_input() -> None:
    """``fn(ctx)`` is a ``Workflow[None, Out]``: started with no input (or None)."""

    @pikku.workflow(name="typing.tick")
    def tick(ctx: Context) -> int:
        return 1

    @pikku.workflow
    def maybe(ctx: Context, count: int | None = None) -> str:
        return str(count)

    assert_type(tick, Workflow[None, int])
    assert_type(tick.start(), RunHandle[int])
    assert_type(tick.start(None), RunHandle[int])
    assert_type(pikku.start(tick), RunHandle[int])
    assert_type(maybe, Workflow[int | None, str])
    assert_type(maybe.start(), RunHandle[str])
    assert_type(maybe.start(3).result(), str)


def inside_a_body() -> None:
    """Children are typed by their workflow; task steps are Any (Celery is untyped)."""

    @pikku.workflow(name="typing.parent")
    def parent(ctx: Context, order: dict[str, Any]) -> int:
        assert_type(ctx.child("ship", ship_order, order), dict[str, Any])
        assert_type(ctx.child("by-name", "shop.ship_order", order), Any)
        first = ctx.child_async("ship-1", ship_order, order)
        second = ctx.child_async("ship-2", ship_order, input=order)
        assert_type(first, StepHandle[dict[str, Any]])
        assert_type(ctx.gather(first, second), list[dict[str, Any]])
        assert_type(
            ctx.gather(first, return_exceptions=True), list[dict[str, Any] | StepFailedError]
        )
        charge = ctx.step("charge", charge_card, order["id"], order["cents"], "key")
        assert_type(charge, Any)
        assert_type(ctx.step_async("charge-2", charge_card, 1, 2, "k"), StepHandle[Any])
        return len(ctx.gather(first))

    assert_type(parent, Workflow[dict[str, Any], int])


def stand_in_tasks(env: WorkflowTestEnv) -> None:
    """``env.task`` (bare, with ``name=``, or called) keeps the function's type."""

    @env.task
    def charge(order_id: int, cents: int) -> str:
        return f"charged {cents}"

    @env.task(name="shop.label", queue="shipping")
    def label(order_id: int) -> dict[str, int]:
        return {"label": order_id}

    assert_type(charge(1, 2), str)
    assert_type(label(order_id=1), dict[str, int])
    assert_type(env.task(len)("abc"), int)


def schedules_keep_the_workflow_s_types() -> None:
    """Stacked, ``@pikku.schedule`` returns the workflow as it was typed; given
    a workflow (or its name) it returns the schedule."""
    from datetime import timedelta

    from pikku_celery.schedule import Schedule

    @pikku.schedule(every=timedelta(minutes=5), input=7, catch_up=1)
    @pikku.workflow(name="typing.scheduled")
    def scheduled(ctx: Context, n: int) -> str:
        return str(n)

    assert_type(scheduled, Workflow[int, str])
    assert_type(pikku.schedule(scheduled, cron="0 3 * * *", name="n"), Schedule)
    assert_type(pikku.schedule("typing.scheduled", every=60, name="m"), Schedule)
