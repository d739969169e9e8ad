"""``task_always_eager``: pikku's messages run in the process that sends them, as
Celery's own eager tasks do, and nothing reaches the broker."""

from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import Pikku, RunStatus
from pikku_celery.store import AttemptStatus, InMemoryWorkflowStore

from . import shop

# Nothing listens there: a publish would fail (or hang on retries), not pass.
CLOSED_BROKER = "amqp://guest:guest@127.0.0.1:1//"


def eager_app() -> Celery:
    app = Celery("eager", set_as_current=False)
    app.conf.update(
        broker_url=CLOSED_BROKER,
        broker_connection_retry=False,
        broker_connection_max_retries=0,
        task_always_eager=True,
    )
    return app


@pytest.fixture(params=["memory", "sqlite"])
def eager_pikku(request: pytest.FixtureRequest, tmp_path: Path) -> Pikku:
    app = eager_app()
    if request.param == "memory":
        return Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)
    return Pikku(app, f"sqlite:///{tmp_path / 'eager.db'}", install_beat=False)


def test_a_run_completes_in_process_without_a_broker(eager_pikku: Pikku) -> None:
    order = shop.install(eager_pikku.app, eager_pikku)
    sent: list[str] = []
    real_send = eager_pikku.app.send_task

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        sent.append(name)
        return real_send(name, *args, **kwargs)

    eager_pikku.app.send_task = spy  # type: ignore[method-assign]
    run = order.start({"id": 3, "cents": 500, "skus": ["a", "b"]})
    output = run.wait(timeout=20)  # the retry delay and the sleep wait on timer threads
    assert sent == []
    assert output["paid"]["order"] == 3
    assert output["reserved"] == ["reserved a", "reserved b"]
    assert output["shipped"] == "label-3"
    charge = {s.step.name: s for s in run.steps()}["charge"]
    assert [a.status for a in charge.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    # no Celery worker ran them: each attempt names this process, and the
    # eager message's own id
    assert all(a.node == eager_pikku.worker_id and a.task_id for a in charge.attempts)


def test_steps_without_delays_finish_before_start_returns(eager_pikku: Pikku) -> None:
    app = eager_pikku.app
    calls: list[tuple[int, int]] = []  # (thread, stack depth) of each step

    @app.task(name="eager.add", shared=False)
    def add(a: int, b: int) -> int:
        calls.append((threading.get_ident(), len(traceback.extract_stack())))
        return a + b

    @eager_pikku.workflow(name="eager.sum")
    def total(ctx: Any, n: int) -> int:
        acc = 0
        for i in range(n):
            acc = ctx.step(f"add-{i}", add, acc, i)
        return int(acc)

    run = total.start(200)
    assert run.status() is RunStatus.COMPLETED
    assert run.result() == sum(range(200))
    # One after another in this thread, each at the same depth: a queue, not
    # 200 nested calls.
    assert {thread for thread, _ in calls} == {threading.get_ident()}
    assert len(calls) == 200
    assert len({depth for _, depth in calls}) == 1
