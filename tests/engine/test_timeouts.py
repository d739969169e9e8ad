"""Step timeouts and run deadlines through the engine, on every engine store.

A step's hard limit interrupts its body in its own thread and fails the
attempt, which counts against its retries; a body that cannot be interrupted
(blocked in C code) stops renewing its lease at its limit, so the sweep hands
the step to another attempt. A run past its deadline fails with
``WorkflowDeadlineError`` when its timer or the sweep wakes it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.engine import Context
from pikku_celery.errors import (
    WorkflowDeadlineError,
    WorkflowFailedError,
    WorkflowTimeoutError,
)
from pikku_celery.store import (
    AttemptStatus,
    InMemoryWorkflowStore,
    NewRun,
    RunStatus,
    StepStatus,
    WorkflowStore,
)
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import long_form, wait_until

from .conftest import Harness, lease_lapsed

LEASE_MS = 400


def _harness(store: WorkflowStore, **options: Any) -> Harness:
    engine, dispatcher = make_engine(
        store,
        InlineDispatcher(lease_ms=LEASE_MS),
        sweep_backoff=0.0,
        idle_after=0.0,
        message_grace=0.0,
        **options,
    )
    return Harness(engine, dispatcher)


def test_a_hung_step_is_interrupted_at_its_timeout_and_retried(store: WorkflowStore) -> None:
    h = _harness(store)

    @h.task
    def hang_once() -> str:
        if h.count("hang") == 1:
            while True:
                time.sleep(0.05)
        return "second"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("hang", hang_once, retries=1, retry_delay=0, timeout=0.3)

    run = wf.start()
    began = time.monotonic()
    h.run(timeout=20)
    assert run.wait(timeout=5) == "second"
    assert time.monotonic() - began < 0.3 + 2 * 1.0  # interrupted within a repeat
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
    first = hist.attempts[0]
    assert first.error is not None and first.error["type"] == "WorkflowStepTimeoutError"
    assert hist.step.timeout_ms == 300


def test_a_step_out_of_attempts_fails_the_run_with_its_timeout() -> None:
    h = _harness(InMemoryWorkflowStore())

    @h.task
    def hang() -> None:
        while True:
            time.sleep(0.05)

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("hang", hang, timeout=0.2)

    run = wf.start()
    h.run(timeout=20)
    with pytest.raises(WorkflowFailedError) as info:
        run.wait(timeout=5)
    assert "WorkflowStepTimeoutError" in info.value.error["message"]


@pytest.mark.parametrize("store", ["memory", "postgres"], indirect=True)
def test_a_body_that_cannot_be_interrupted_loses_its_lease_at_its_timeout(
    store: WorkflowStore,
) -> None:
    """Blocked in C code, the body never sees the interrupt: its lease is no
    longer renewed past its limit, the sweep takes the step over, and the
    body's late result is refused."""
    h = _harness(store)
    stuck = threading.Event()

    @h.task
    def blocked() -> str:
        if h.count("blocked") == 1:
            stuck.wait(30)  # a lock wait: no bytecode runs until it returns
            return "late"
        return "taken over"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("blocked", blocked, retries=1, retry_delay=0, timeout=0.2)

    run = wf.start()
    (msg,) = h.dispatcher.messages
    h.dispatcher.messages.clear()
    first = threading.Thread(target=h.dispatcher.deliver, args=(msg,), daemon=True)
    first.start()
    try:
        wait_until(lambda: h.calls.get("blocked") == 1)
        step_id = run.steps()[0].step.id
        # renewed at half the lease while under its limit, then never again
        wait_until(lambda: lease_lapsed(h, step_id), timeout=10)
        assert h.engine.sweep().requeued_lapsed == 1
        h.run()
        assert run.wait(timeout=5) == "taken over"
    finally:
        stuck.set()
        first.join(10)
    (hist,) = run.steps()
    assert hist.step.result == "taken over"
    assert [a.status for a in hist.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]


def test_a_run_past_its_deadline_fails_and_closes_its_hung_step(store: WorkflowStore) -> None:
    h = _harness(store)
    release = threading.Event()

    @h.task
    def slow() -> str:
        h.count("slow")
        release.wait(30)
        return "late"

    @h.workflow(timeout=0.4)
    def wf(ctx: Context) -> Any:
        return ctx.step("slow", slow)

    run = wf.start()
    state = run.state()
    assert state.deadline_at is not None and state.deadline_at == state.created_at + 400
    (msg,) = [m for m in h.dispatcher.messages if m.kind == "step"]
    h.dispatcher.messages.remove(msg)
    worker = threading.Thread(target=h.dispatcher.deliver, args=(msg,), daemon=True)
    worker.start()
    try:
        wait_until(lambda: h.calls.get("slow") == 1)
        # its own timer (sent with the first pass) wakes it at the deadline
        h.run(timeout=10)
        with pytest.raises(WorkflowDeadlineError) as info:
            run.wait(timeout=5)
    finally:
        release.set()
        worker.join(10)
    assert isinstance(info.value, WorkflowTimeoutError)
    assert isinstance(info.value, WorkflowFailedError)
    (hist,) = run.steps()
    assert hist.step.status == StepStatus.FAILED and hist.step.result is None  # "late" refused
    assert hist.step.error is not None and hist.step.error["type"] == "WorkflowDeadlineError"
    assert [a.status for a in hist.attempts] == [AttemptStatus.CANCELLED]


def test_the_sweep_fails_an_overdue_run_whose_timer_was_lost(store: WorkflowStore) -> None:
    h = _harness(store)

    @h.workflow
    def wf(ctx: Context) -> Any:
        ctx.sleep("nap", 3600)
        return "woke"

    h.dispatcher.drop = lambda msg: msg.kind == "run"  # every wake-up lost
    run = wf.start(timeout=0.3)
    h.dispatcher.drop = None
    wait_until(lambda: h.engine.store.now_ms() >= (run.state().deadline_at or 0), timeout=10)
    report = h.engine.sweep()
    assert report.overdue == 1
    h.run()
    with pytest.raises(WorkflowDeadlineError):
        run.wait(timeout=5)
    assert h.engine.sweep().overdue == 0  # settled: never woken again


def test_start_timeout_overrides_the_workflows_and_none_means_no_deadline() -> None:
    h = _harness(InMemoryWorkflowStore())

    @h.workflow(timeout=3600)
    def wf(ctx: Context) -> str:
        return "done"

    @h.workflow
    def free(ctx: Context) -> str:
        return "done"

    long_run, short_run, plain = wf.start(), wf.start(timeout=60), free.start()
    h.run()
    assert long_run.wait(timeout=5) == short_run.wait(timeout=5) == plain.wait(timeout=5)
    long_state, short_state = long_run.state(), short_run.state()
    assert long_state.deadline_at == long_state.created_at + 3_600_000
    assert short_state.deadline_at == short_state.created_at + 60_000
    assert plain.state().deadline_at is None
    assert long_state.status == RunStatus.COMPLETED


def test_timeouts_that_are_not_positive_are_refused_at_the_boundary() -> None:
    h = _harness(InMemoryWorkflowStore())

    @h.workflow
    def wf(ctx: Context) -> str:
        return "done"

    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            wf.start(timeout=bad)
    with pytest.raises(ValueError, match="timeout"):
        h.workflow(lambda ctx: None, name="bad", timeout=0)


def test_one_sweep_wakes_every_overdue_run_a_page_at_a_time() -> None:
    """Each run it wakes is backed off, which takes it out of the next page."""
    engine, dispatcher = make_engine(
        InMemoryWorkflowStore(), InlineDispatcher(lease_ms=LEASE_MS), sweep_backoff=60.0
    )
    h = Harness(engine, dispatcher)

    @h.workflow
    def wf(ctx: Context) -> Any:
        ctx.sleep("nap", 3600)
        return "woke"

    h.dispatcher.drop = lambda msg: msg.kind == "run"  # every wake-up lost
    runs = [wf.start(timeout=0.05) for _ in range(25)]
    h.dispatcher.drop = None
    wait_until(lambda: h.engine.store.now_ms() >= max(r.state().deadline_at or 0 for r in runs))
    report = h.engine.sweep(limit=10)  # three pages
    assert report.overdue == 25
    h.run()
    assert {r.state().status for r in runs} == {RunStatus.FAILED}
    assert h.engine.sweep(limit=10).overdue == 0


@long_form("10^4 overdue runs on PostgreSQL")
def test_long_ten_thousand_overdue_runs_are_failed_by_the_sweep(
    postgres_engine: sa.Engine,
) -> None:
    """Every run past its deadline, every wake-up lost: the sweep alone fails
    them all, and reads only the runs it acts on (an indexed query)."""
    from pikku_celery.sql.schema import metadata
    from pikku_celery.store.sql_for import store_for

    metadata.create_all(postgres_engine)
    store = store_for(postgres_engine)
    engine, dispatcher = make_engine(store, InlineDispatcher(lease_ms=LEASE_MS), sweep_backoff=60.0)
    h = Harness(engine, dispatcher)

    @h.workflow(name="long.overdue")
    def wf(ctx: Context) -> Any:
        ctx.sleep("nap", 3600)
        return "woke"

    n = int(os.environ.get("PIKKU_LONG_RUNS", "10000"))
    began = time.monotonic()
    ids = [
        store.create_run(NewRun(workflow=wf.name, input=None, timeout_ms=1))[0].id for _ in range(n)
    ]
    created = time.monotonic() - began
    began = time.monotonic()
    sweeps = woken = 0
    while woken < n and sweeps < 10:
        report = h.engine.sweep()
        # these runs have no step in flight: some count as idle (woken all the same)
        woken += report.overdue + report.idle
        sweeps += 1
    swept = time.monotonic() - began
    began = time.monotonic()
    h.dispatcher.run_until_idle(timeout=600, max_messages=n + 10)
    passed = time.monotonic() - began
    failed = sum(1 for rid in ids if (run := store.get_run(rid)) and run.status == RunStatus.FAILED)
    print(
        f"{n} overdue runs: created in {created:.1f} s; {sweeps} sweep(s) woke {woken} "
        f"in {swept:.1f} s; their passes failed {failed} in {passed:.1f} s"
    )
    assert woken >= n and failed == n
    assert sweeps == 1
    store.close()
