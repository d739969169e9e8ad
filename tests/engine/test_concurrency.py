"""Concurrency per key through the engine, on the memory, SQLite and PostgreSQL stores.

The inline dispatcher delivers one message at a time, so these tests show the
bookkeeping (who is queued, admitted, cancelled, in which order, and what the
sweep heals); the real races are in tests/store/test_concurrency_slots.py and
tests/celery/test_concurrency_workers.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from pikku_celery import (
    Concurrency,
    Context,
    IdempotencyKeyReusedError,
    RunStatus,
    WorkflowCancelledError,
)
from pikku_celery.engine import orchestrate as orchestrate_module
from pikku_celery.model.values import NewRun
from pikku_celery.store import WorkflowStore
from pikku_celery.testing import make_engine
from tests.engine.conftest import Harness


def by_customer(order: dict[str, Any]) -> str:
    return str(order["customer"])


def test_one_key_runs_its_starts_one_at_a_time_in_start_order(h: Harness) -> None:
    @h.task
    def export(n: int) -> int:
        return n

    @h.workflow(concurrency=Concurrency(key=by_customer, limit=1))
    def exports(ctx: Context, order: dict[str, Any]) -> int:
        return int(ctx.step("export", export, order["n"]))

    runs = [exports.start({"customer": "c1", "n": n}) for n in range(4)]
    other = exports.start({"customer": "c2", "n": 9})
    assert [r.status() for r in runs] == [RunStatus.RUNNING] + [RunStatus.QUEUED] * 3
    assert other.status() == RunStatus.RUNNING  # another key has slots of its own
    h.run()
    assert [r.wait(timeout=5) for r in runs] == [0, 1, 2, 3]
    # each run's step starts once the run before it (in start order) finished
    for before, after in itertools.pairwise(runs):
        (a,) = before.steps()
        (b,) = after.steps()
        assert a.attempts[-1].finished_at is not None
        assert a.attempts[-1].finished_at <= b.attempts[0].started_at


def test_a_limit_of_two_admits_two(h: Harness) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow(concurrency=Concurrency(key=lambda _: "tenant", limit=2))
    def job(ctx: Context) -> None:
        ctx.step("noop", noop)

    runs = [job.start() for _ in range(3)]
    assert [r.status() for r in runs] == [RunStatus.RUNNING] * 2 + [RunStatus.QUEUED]
    h.run()
    assert [r.status() for r in runs] == [RunStatus.COMPLETED] * 3


def test_cancel_newest_ends_the_new_start_cancelled(h: Harness) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow(concurrency=Concurrency(key=lambda _: "doc", on_limit="cancel_newest"))
    def job(ctx: Context) -> None:
        ctx.step("noop", noop)

    first, second = job.start(), job.start()
    assert second.status() == RunStatus.CANCELLED
    with pytest.raises(WorkflowCancelledError):
        second.wait(timeout=1)
    h.run()
    assert first.status() == RunStatus.COMPLETED
    third = job.start()  # the slot is free again
    h.run()
    assert third.status() == RunStatus.COMPLETED


def test_cancel_in_progress_leaves_only_the_newest_completed(h: Harness) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow(concurrency=Concurrency(key=lambda _: "doc", on_limit="cancel_in_progress"))
    def job(ctx: Context) -> None:
        ctx.step("noop", noop)

    runs = [job.start() for _ in range(4)]
    h.run()
    assert [r.status() for r in runs] == [RunStatus.CANCELLED] * 3 + [RunStatus.COMPLETED]
    trail = h.engine.store.audit_trail(runs[0].run_id)
    assert trail and trail[0].actor == "concurrency"


def test_a_queued_run_cancelled_by_an_operator_ends_and_holds_no_one_back(h: Harness) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow(concurrency=Concurrency(key=lambda _: "k"))
    def job(ctx: Context) -> None:
        ctx.step("noop", noop)

    first, second, third = job.start(), job.start(), job.start()
    assert second.cancel().status == RunStatus.CANCELLED  # at once: nothing runs for it
    h.run()
    assert [r.status() for r in (first, second, third)] == [
        RunStatus.COMPLETED,
        RunStatus.CANCELLED,
        RunStatus.COMPLETED,
    ]


def test_the_sweep_frees_the_slot_of_a_run_whose_worker_died_after_it_settled(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow(concurrency=Concurrency(key=lambda _: "k"))
    def job(ctx: Context) -> None:
        ctx.step("noop", noop)

    first, second = job.start(), job.start()
    # The worker dies right after the pass that settled the first run committed.
    monkeypatch.setattr(orchestrate_module, "left", lambda engine, run: None)
    h.run()
    assert (first.status(), second.status()) == (RunStatus.COMPLETED, RunStatus.QUEUED)
    monkeypatch.undo()
    report = h.engine.sweep()
    assert report.admitted == 1
    h.run()
    assert second.status() == RunStatus.COMPLETED


def test_the_sweep_enters_a_queued_run_whose_start_stopped_before_its_entry(
    store: WorkflowStore,
) -> None:
    engine, dispatcher = make_engine(store, message_grace=0.0)

    @engine.workflow(concurrency=Concurrency(key=lambda _: "k"))
    def job(ctx: Context) -> str:
        return "done"

    run, _ = store.create_run(NewRun(workflow=job.name, input=None, status=RunStatus.QUEUED))
    assert engine.sweep().admitted == 1
    dispatcher.run_until_idle()
    assert engine.handle(run.id).wait(timeout=5) == "done"


def test_a_bad_key_is_refused_at_start_and_nothing_is_written(h: Harness) -> None:
    @h.workflow(concurrency=Concurrency(key=lambda order: order.get("customer")))
    def job(ctx: Context, order: dict[str, Any]) -> None:
        return None

    with pytest.raises(ValueError, match="concurrency key"):
        job.start({"no": "customer"})
    assert h.engine.store.list_runs(workflow=job.name) == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"key": "customer"}, TypeError),
        ({"key": by_customer, "limit": 0}, ValueError),
        ({"key": by_customer, "on_limit": "drop"}, ValueError),
    ],
)
def test_concurrency_refuses_what_it_cannot_enforce(
    args: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Concurrency(**args)


def test_a_message_for_a_queued_run_runs_nothing_and_a_signal_waits_for_it(h: Harness) -> None:
    @h.workflow(concurrency=Concurrency(key=lambda _: "k"))
    def job(ctx: Context) -> Any:
        return ctx.wait_for_signal("go")

    first, second = job.start(), job.start()
    second.signal("go", "second's")
    h.engine.orchestrate(second.run_id, "redelivered")  # a stray or redelivered wake-up
    assert second.status() == RunStatus.QUEUED and second.steps() == []
    first.signal("go", "first's")
    h.run()
    assert first.wait(timeout=5) == "first's"
    assert second.wait(timeout=5) == "second's"


def test_an_idempotency_key_used_again_returns_the_run_and_takes_no_second_place(
    h: Harness,
) -> None:
    @h.workflow(concurrency=Concurrency(key=by_customer))
    def job(ctx: Context, order: dict[str, Any]) -> Any:
        return ctx.wait_for_signal("go")  # holds its slot meanwhile

    first = job.start({"customer": "c", "n": 1}, idempotency_key="order-1")
    again = job.start({"customer": "c", "n": 1}, idempotency_key="order-1")
    assert again.run_id == first.run_id
    slots = h.engine.capabilities.slots
    assert slots is not None
    assert [s.run_id for s in slots.slots_of(f"{job.name}:c")] == [first.run_id]
    with pytest.raises(IdempotencyKeyReusedError):
        job.start({"customer": "c", "n": 2}, idempotency_key="order-1")
