"""Progress events (``ctx.set_event``, ``RunHandle.get_event``/``events``) on every store."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery import EventNotSetError, EventTimeoutError, RunEvent
from pikku_celery.engine import Context
from pikku_celery.errors import PayloadError, RunNotFoundError, WorkflowFailedError
from pikku_celery.store import InMemoryWorkflowStore, StepKind, WorkflowStore

from .conftest import Harness, _sql_store, make_harness

EVENT_STORES = ["memory", "sqlite", "postgres", "mariadb"]
ENGINES = {"sqlite": "sqlite_engine", "postgres": "postgres_engine", "mariadb": "mysql_engine"}


@pytest.fixture(params=EVENT_STORES)
def ev(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """A harness on each store, MariaDB included."""
    if request.param == "memory":
        store: WorkflowStore = InMemoryWorkflowStore()
    else:
        store = _sql_store(request.getfixturevalue(ENGINES[request.param]))
    yield make_harness(store)
    close = getattr(store, "close", None)
    if close is not None:
        close()


def test_events_are_read_in_order_and_get_event_gives_the_latest(ev: Harness) -> None:
    @ev.task
    def work(i: int) -> int:
        return i * 10

    @ev.workflow
    def job(ctx: Context, n: int) -> int:
        ctx.set_event("stage", "started")
        total = 0
        for i in range(n):
            total += ctx.step(f"work-{i}", work, i)
            ctx.set_event("progress", {"done": i + 1, "of": n})
        ctx.set_event("stage", "finished")
        return total

    run = job.start(3)
    ev.run()
    assert run.wait(timeout=10) == 30
    events = run.events()
    assert all(isinstance(e, RunEvent) for e in events)
    assert [(e.key, e.number, e.value) for e in events] == [
        ("stage", 0, "started"),
        ("progress", 0, {"done": 1, "of": 3}),
        ("progress", 1, {"done": 2, "of": 3}),
        ("progress", 2, {"done": 3, "of": 3}),
        ("stage", 1, "finished"),
    ]
    assert run.get_event("progress", timeout=0) == {"done": 3, "of": 3}
    assert run.get_event("stage") == "finished"
    # Each is a value step in the run's history, named after its key and number.
    names = [s.step.name for s in run.steps() if s.step.kind == StepKind.VALUE]
    assert names == [
        "event:stage#0",
        "event:progress#0",
        "event:progress#1",
        "event:progress#2",
        "event:stage#1",
    ]


def test_a_replay_does_not_set_an_event_twice_and_keeps_its_first_value(ev: Harness) -> None:
    # No parked bodies: every pass replays the body from the top.
    ev.engine.limits = dataclasses.replace(ev.engine.limits, resume_max_bodies=0)

    @ev.task
    def flaky() -> str:
        if ev.count("flaky") < 3:
            raise ConnectionError("busy")
        return "ok"

    @ev.workflow
    def job(ctx: Context) -> Any:
        # A body that is not deterministic about the value: the recorded one stands.
        ctx.set_event("pass", ev.count("body"))
        return ctx.step("flaky", flaky, retries=3, retry_delay=0.01, backoff=1)

    run = job.start()
    ev.run()
    assert run.wait(timeout=10) == "ok"
    assert ev.calls["body"] >= 3  # replayed on every pass
    assert [(e.key, e.number, e.value) for e in run.events()] == [("pass", 0, 1)]


def test_get_event_waits_for_a_value_set_later(ev: Harness) -> None:
    @ev.workflow
    def job(ctx: Context) -> str:
        ctx.set_event("stage", "waiting")
        ctx.wait_for_signal("go")
        ctx.set_event("late", "here")
        return "done"

    run = job.start()
    ev.run()
    assert run.get_event("stage", timeout=5) == "waiting"
    with pytest.raises(EventTimeoutError, match="'late'"):
        run.get_event("late", timeout=0.05)

    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(run.get_event("late", timeout=30)))
    waiter.start()
    ev.engine.send_signal(run.run_id, "go", None)
    ev.run()
    waiter.join(timeout=30)
    assert got == ["here"]
    assert run.wait(timeout=5) == "done"


def test_get_event_of_a_key_never_set_raises_once_the_run_ended(ev: Harness) -> None:
    @ev.workflow
    def job(ctx: Context) -> int:
        ctx.set_event("stage", 1)
        return 1

    run = job.start()
    ev.run()
    run.wait(timeout=5)
    with pytest.raises(EventNotSetError, match="ended completed without setting it"):
        run.get_event("never")  # no timeout: the run's end answers
    assert not isinstance(EventNotSetError(run.run_id, "k", "x"), TimeoutError)


def test_get_event_refuses_a_key_no_run_could_set_and_an_unknown_run(ev: Harness) -> None:
    @ev.workflow
    def job(ctx: Context) -> int:
        return 1

    run = job.start()
    for bad in ("", "nul\x00key", "k" * 300):
        with pytest.raises(PayloadError, match="event key"):
            run.get_event(bad, timeout=0)
    unknown = ev.engine.handle("6f1c1e0e-1111-4222-8333-444455556666")
    with pytest.raises(RunNotFoundError):
        unknown.get_event("progress", timeout=0)
    with pytest.raises(RunNotFoundError):
        unknown.events()


def test_an_event_value_that_is_not_json_fails_the_run_clearly(ev: Harness) -> None:
    @ev.workflow
    def job(ctx: Context) -> int:
        ctx.set_event("stage", {1, 2})
        return 1

    run = job.start()
    ev.run()
    with pytest.raises(WorkflowFailedError, match="event 'stage'"):
        run.wait(timeout=5)
    assert run.events() == []
