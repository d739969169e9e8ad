"""The Pikku the run page's tests serve, and the worker's part played by hand.

A memory broker nobody consumes: starting a run takes its first pass inline
and publishes the step's message where no worker takes it; :func:`drive`
runs the steps here, through the engine, as a worker would. The store is an
SQLite file (the end-to-end tests, the killed worker) or in memory.

``web.packs``'s ``pack`` step hangs in a process started with
``PIKKU_WEB_HANG_MARK`` set (after writing its pid there), so a test can
SIGKILL that process mid-step: see :mod:`tests.web.killed_worker`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku
from pikku_celery.engine import call_with
from pikku_celery.store import Delivery, InMemoryWorkflowStore, StepKind, StepState, StepStatus

ORDER = "web.order"
FAILS = "web.fails"
WAITS = "web.waits"
PACKS = "web.packs"
PARENT = "web.parent"
RETRIES = "web.retries"
CHARGES = "web.charges"
PROGRESS = "web.progress"
LONG = "web.long"
DECLINING = threading.Event()  # set: web.charge declines (a failure an operator retries)
LEASE_S = 1.0  # the step lease: a killed worker's step is taken over this long after


def build(database_url: str | None = None, name: str = "webtest") -> Pikku:
    """A fresh Celery app and Pikku on ``database_url`` (None: in memory)."""
    app = Celery(name, broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "celery"
    store = None if database_url else InMemoryWorkflowStore()
    pikku = Pikku(
        app, database_url, store=store, install_beat=False, queue_leases={"celery": LEASE_S}
    )

    @app.task(name="web.add", shared=False)
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="web.label", shared=False)
    def label(total: int) -> str:
        return f"parcel-{total}"

    @app.task(name="web.explode", shared=False)
    def explode(order: Any) -> None:
        raise RuntimeError(f"the courier exploded on {order!r}")

    @app.task(name="web.pack", shared=False)
    def pack(order: int) -> str:
        mark = os.environ.get("PIKKU_WEB_HANG_MARK")
        if mark:  # the worker that is about to be SIGKILLed mid-step
            with open(mark, "w") as out:
                out.write(str(os.getpid()))
            threading.Event().wait()
        return f"box-{order}"

    @app.task(name="web.charge", shared=False)
    def charge(order_id: int, cents: int, note: str = "") -> str:
        if DECLINING.is_set():
            raise RuntimeError(f"card declined for order {order_id}")
        return f"charged {cents}"

    @pikku.workflow(name=CHARGES)
    def charges(ctx: Context, order: dict[str, Any]) -> Any:
        return ctx.step("charge", charge, order["id"], order["cents"], note=order["note"])

    @pikku.workflow(name=ORDER)
    def order(ctx: Context, data: dict[str, int]) -> dict[str, Any]:
        total = ctx.step("add", add, data["a"], data["b"])
        return {"total": total, "label": ctx.step("label", label, total)}

    @pikku.workflow(name=FAILS)
    def fails(ctx: Context, order: Any) -> None:
        ctx.step("explode", explode, order)

    @pikku.workflow(name=WAITS)
    def waits(ctx: Context, data: Any) -> Any:
        total = ctx.step("add", add, 1, 2)
        return {"total": total, "approval": ctx.wait_for_signal("approval", timeout=3600)}

    @pikku.workflow(name=PACKS)
    def packs(ctx: Context, order: int) -> dict[str, Any]:
        total = ctx.step("add", add, order, 1)
        ctx.sleep("cool-off", 0.3)
        return {"total": total, "box": ctx.step("pack", pack, order, retries=1)}

    @pikku.workflow(name=RETRIES)
    def retries(ctx: Context, data: dict[str, int]) -> Any:
        return ctx.step("add", add, data["a"], data["b"], retries=1)

    @pikku.workflow(name=PROGRESS)
    def progress(ctx: Context, parcels: int) -> Any:
        ctx.set_event("stage", "packing")
        for done in range(1, parcels + 1):
            ctx.step(f"pack-{done}", add, done, 0)
            ctx.set_event("packed", done)
        ctx.set_event("stage", "waiting for the courier")
        ctx.wait_for_signal("courier", timeout=3600)
        ctx.set_event("stage", "shipped")
        return parcels

    @pikku.workflow(name=LONG)
    def long(ctx: Context, n: int) -> Any:
        for _ in range(n):  # a long history without a worker: a value step each
            ctx.now()
        ctx.wait_for_signal("go", timeout=3600)
        return ctx.now().isoformat()

    @pikku.workflow(name=PARENT)
    def parent(ctx: Context, data: dict[str, int]) -> Any:
        return ctx.child("order", ORDER, data)

    return pikku


def due_steps(pikku: Pikku, run_id: str) -> list[StepState]:
    """The run's task steps that wait for a worker now."""
    return [
        s
        for s in pikku.store.get_steps(run_id)
        if s.kind == StepKind.TASK and s.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
    ]


def run_step(pikku: Pikku, step: StepState, delivery: Delivery | None = None) -> None:
    """One attempt of ``step`` here, as a worker runs it (claim, body, pass);
    ``delivery`` is what a Celery worker would say of its message."""
    assert step.task_name is not None
    task = pikku.app.tasks[step.task_name]
    pikku.execute_step(
        step.run_id, step.id, step.task_name, call_with(task.run), step.queue, delivery=delivery
    )


def drive(pikku: Pikku, *run_ids: str, delivery: Delivery | None = None) -> None:
    """Run every step the runs wait on (their children's too), until none is left."""
    for _ in range(50):
        ids = set(run_ids)
        for run_id in run_ids:
            ids.update(s.child_run_id for s in pikku.store.get_steps(run_id) if s.child_run_id)
        steps = [s for run_id in ids for s in due_steps(pikku, run_id)]
        if not steps:
            for run_id in ids:  # a child's end wakes its parent by a message: pass here
                pikku.orchestrate(run_id, "test")
            if not any(due_steps(pikku, run_id) for run_id in ids):
                return
            continue
        for step in steps:
            run_step(pikku, step, delivery)
    raise AssertionError(f"runs {run_ids} kept asking for steps")
