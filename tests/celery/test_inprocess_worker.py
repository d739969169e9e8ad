"""End to end on Celery's in-process test worker (memory broker)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from pikku_celery import Pikku
from pikku_celery.store import AttemptStatus, InMemoryWorkflowStore
from tests.helpers import memory_broker_config

from . import shop


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return memory_broker_config()


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": ("celery", "shipping"), "perform_ping_check": False}


@pytest.fixture
def shop_app(celery_app: Celery, request: pytest.FixtureRequest) -> Iterator[tuple[Pikku, Any]]:
    pikku = Pikku(celery_app, store=InMemoryWorkflowStore(), queue_leases={"celery": 30})
    order = shop.install(celery_app, pikku)
    request.getfixturevalue("celery_worker")  # start the worker after registration
    yield pikku, order


def test_a_five_step_order_completes_with_its_attempt_history(
    shop_app: tuple[Pikku, Any],
) -> None:
    _, order = shop_app
    run = order.start({"id": 7, "cents": 1999, "skus": ["a", "b"]})
    output = run.wait(timeout=20)
    assert output["reserved"] == ["reserved a", "reserved b"]
    assert output["shipped"] == "label-7"
    assert output["paid"]["order"] == 7
    history = {s.step.name: s for s in run.steps()}
    charge = history["charge"]
    assert [a.status for a in charge.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    assert charge.attempts[0].error is not None
    assert charge.attempts[0].error["type"] == "ConnectionError"
    # self.request.id is the attempt's own id, stable per attempt.
    assert output["paid"]["request_id"] not in ("", None)
    assert set(history) == {"charge", "reserve-a", "reserve-b", "cooling-off", "ship"}
    assert all(
        len(s.attempts) == 1 for n, s in history.items() if n not in ("charge",) and s.attempts
    )


def test_a_step_keeps_its_tasks_limits_and_request(
    celery_app: Celery, request: pytest.FixtureRequest
) -> None:
    pikku = Pikku(celery_app, store=InMemoryWorkflowStore(), queue_leases={"celery": 30})

    @celery_app.task(
        name="limits.report", bind=True, shared=False, rate_limit="100/s",
        time_limit=30, soft_time_limit=20,
    )  # fmt: skip
    def report(self: Any, n: int) -> dict[str, Any]:
        return {
            "id": self.request.id,
            "retries": self.request.retries,
            "timelimit": list(self.request.timelimit or ()),
            "n": n,
        }

    @pikku.workflow(name="limits.wf")
    def wf(ctx: Any) -> Any:
        return [ctx.step("a", report, 1), ctx.step("b", report, 2)]

    sent: list[str] = []
    real_send = celery_app.send_task

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(name)
        return real_send(name, *args, **kwargs)

    celery_app.send_task = spy  # type: ignore[method-assign]
    request.getfixturevalue("celery_worker")
    run = wf.start()
    a, b = run.wait(timeout=20)
    # The rate limit travels on a run-step task of its own, with the same limit.
    assert "pikku.run_step:limits.report" in sent
    assert celery_app.tasks["pikku.run_step:limits.report"].rate_limit == "100/s"
    # The body sees a real request: a stable id per attempt, its time limits.
    assert a["timelimit"] == [30, 20] and a["retries"] == 0
    assert a["id"] != b["id"] and a["id"]


def test_each_attempt_names_the_celery_message_that_carried_it_and_the_worker_node(
    shop_app: tuple[Pikku, Any],
) -> None:
    from celery import signals

    from pikku_celery.model.values import EAGER

    _, order = shop_app
    carried: dict[str, str] = {}  # the run-step messages the worker ran: id -> its hostname

    def received(task_id: str, task: Any, **_: Any) -> None:
        if task.name.startswith("pikku.run_step"):
            carried[task_id] = task.request.hostname

    signals.task_prerun.connect(received, weak=False)
    try:
        run = order.start({"id": 8, "cents": 500, "skus": ["a"]})
        run.wait(timeout=20)
    finally:
        signals.task_prerun.disconnect(received)
    attempts = [a for h in run.steps() for a in h.attempts if h.step.task_name]
    assert len(attempts) >= 3
    for attempt in attempts:
        assert attempt.task_id in carried, attempt  # a message id the worker logged
        assert attempt.node == carried[attempt.task_id]  # the worker's name, as Celery has it
        assert attempt.node != attempt.worker  # Celery's node name, not host:pid
    by_message = [a for a in attempts if a.dispatch != EAGER]
    assert len({a.task_id for a in by_message}) == len(by_message)  # one message each
    for eager in (a for a in attempts if a.dispatch == EAGER):
        assert eager.task_id in {a.task_id for a in by_message}  # its carrier's
