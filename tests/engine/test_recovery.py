"""Worker death, lease renewal and the sweep, on every store."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.engine.keeper import StepHolding
from pikku_celery.errors import WorkflowFailedError
from pikku_celery.store import (
    AttemptStatus,
    InMemoryWorkflowStore,
    RunStatus,
    StepStatus,
    WorkflowStore,
)
from pikku_celery.testing import InlineDispatcher
from tests.helpers import wait_until

from .conftest import Harness, kill_renewals, lease_lapsed

LEASE_MS = 300


def _harness(store: WorkflowStore, lease_ms: int = LEASE_MS) -> Harness:
    return make_harness_with(store, InlineDispatcher(lease_ms=lease_ms))


def make_harness_with(store: WorkflowStore, dispatcher: InlineDispatcher) -> Harness:
    from pikku_celery.testing import make_engine

    engine, dispatcher = make_engine(
        store, dispatcher, sweep_backoff=0.0, idle_after=0.0, message_grace=0.0
    )
    return Harness(engine, dispatcher)


def test_a_dead_attempt_is_taken_over_and_its_late_result_refused(
    store: WorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _harness(store)
    release_first = threading.Event()

    @h.task
    def work() -> str:
        if h.count("work") == 1:
            release_first.wait(30)
            return "first"
        return "second"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("work", work, retries=2)

    kill_renewals(h, monkeypatch)
    run = wf.start()
    (msg,) = h.dispatcher.messages
    h.dispatcher.messages.clear()
    outcomes: list[Any] = []
    first = threading.Thread(target=lambda: outcomes.append(h.dispatcher.deliver(msg)))
    first.start()
    try:
        wait_until(lambda: h.calls.get("work") == 1)
        step_id = run.steps()[0].step.id
        wait_until(lambda: lease_lapsed(h, step_id), timeout=5)
        report = h.engine.sweep()
        assert report.requeued_lapsed == 1
        h.run()
        assert run.wait(timeout=5) == "second"
    finally:
        release_first.set()
        first.join(10)
    (hist,) = run.steps()
    assert hist.step.attempt == 2 and hist.step.result == "second"
    assert [a.status for a in hist.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]
    assert hist.attempts[0].result is None  # the late "first" never landed
    assert run.state().output == "second"


def test_a_step_whose_worker_dies_on_every_attempt_fails_for_good(
    store: WorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _harness(store)
    never = threading.Event()

    @h.task
    def hang() -> None:
        h.count("hang")
        never.wait(30)

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("hang", hang, retries=1)

    kill_renewals(h, monkeypatch)
    run = wf.start()
    step_id = run.steps()[0].step.id
    workers: list[threading.Thread] = []
    try:
        for attempt in (1, 2):
            (msg,) = h.dispatcher.messages
            h.dispatcher.messages.clear()
            t = threading.Thread(target=h.dispatcher.deliver, args=(msg,), daemon=True)
            t.start()
            workers.append(t)
            wait_until(lambda a=attempt: h.calls.get("hang") == a)
            wait_until(lambda: lease_lapsed(h, step_id), timeout=5)
            h.engine.sweep()
        assert h.dispatcher.messages and all(m.kind == "run" for m in h.dispatcher.messages)
        h.run()
        with pytest.raises(WorkflowFailedError) as info:
            run.wait(timeout=5)
    finally:
        never.set()
        for t in workers:
            t.join(10)
    assert "WorkflowStepLeaseExpiredError" in info.value.error["message"]
    (hist,) = run.steps()
    assert hist.step.status == StepStatus.FAILED and hist.step.attempt == 2
    assert [a.status for a in hist.attempts] == [
        AttemptStatus.SUPERSEDED,
        AttemptStatus.LEASE_EXPIRED,
    ]
    assert h.calls["hang"] == 2  # no third attempt


def test_a_short_lease_is_renewed_at_half_and_warned_about_once(
    store: WorkflowStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _harness(store, lease_ms=400)
    holdings: list[StepHolding] = []
    real_hold = h.engine.keeper.hold

    def spy(
        step_id: str,
        attempt: int,
        lease_ms: int,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> StepHolding:
        holding = real_hold(step_id, attempt, lease_ms, claim_id, run_id=run_id)
        holdings.append(holding)
        return holding

    monkeypatch.setattr(h.engine.keeper, "hold", spy)
    done = threading.Event()

    @h.task
    def slow() -> str:
        # Runs until three renewals (at ~200, 400, 600 ms) have happened.
        wait_until(lambda: holdings and holdings[-1].renewals >= 3, timeout=5)
        done.set()
        return "ok"

    @h.task
    def quick() -> str:
        return "quick"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return [ctx.step("slow", slow), ctx.step("quick", quick)]

    with caplog.at_level(logging.WARNING):
        run = wf.start()
        h.run()
        assert run.wait(timeout=5) == ["ok", "quick"]
    slow_holding, quick_holding = holdings
    assert slow_holding.renewals >= 3 and not slow_holding.lost.is_set()
    assert quick_holding.renewals == 0  # shorter than half its lease: never renewed
    warnings = [r for r in caplog.records if "under 2 s" in r.getMessage()]
    assert len(warnings) == 1


def test_a_parked_parent_step_is_never_reclaimed_and_resumes_without_its_message(
    store: WorkflowStore,
) -> None:
    h = _harness(store)

    @h.workflow(name="child-waits")
    def child(ctx: Context) -> Any:
        return ctx.wait_for_signal("go")

    @h.workflow
    def parent(ctx: Context) -> Any:
        return {"child said": ctx.child("kid", child)}

    run = parent.start()
    h.run()
    kid = run.steps()[0].step
    assert kid.status == StepStatus.RUNNING and kid.lease_expires_at is None
    # However long it waits, the sweep never treats the parked step as lapsed.
    assert h.engine.store.lapsed_steps(100) == []
    h.engine.sweep()
    h.run()
    assert run.steps()[0].step.attempt == 1
    # The child's "parent, wake up" message is lost on the way.
    assert kid.child_run_id is not None
    h.dispatcher.drop = lambda m: m.reason == "child-ended"
    h.engine.send_signal(kid.child_run_id, "go", "hello")
    h.run()
    assert h.engine.handle(kid.child_run_id).status() == RunStatus.COMPLETED
    assert run.status() == RunStatus.RUNNING
    h.dispatcher.drop = None
    report = h.engine.sweep()
    assert report.idle == 1
    h.run()
    assert run.wait(timeout=5) == {"child said": "hello"}


def test_overlapping_sweeps_do_not_double_the_work(store: WorkflowStore) -> None:
    h = _harness(store)

    @h.task
    def noop() -> None:
        return None

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("only", noop)

    runs = [wf.start() for _ in range(3)]
    h.dispatcher.messages.clear()  # every step message is lost
    h.engine.sweep_backoff = 60.0
    reports = []
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        reports.append(h.engine.sweep())

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    resent = [m.run_id for m in h.dispatcher.messages]
    assert sorted(resent) == sorted(r.run_id for r in runs)  # each exactly once
    assert sum(r.resent for r in reports) == 3
    h.run()
    assert [r.wait(timeout=5) for r in runs] == [None, None, None]


class _Outage(Exception):
    """Stands for a lost database connection."""


class _FlakyStore(InMemoryWorkflowStore):
    """Fails the next few passes that carry an outcome, as a restarting database would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def is_transient(self, exc: BaseException) -> bool:
        return isinstance(exc, _Outage)

    def write_pass(self, read: Any, plan: Any) -> Any:
        if plan.outcome is not None and self.failures > 0:
            self.failures -= 1
            raise _Outage("connection lost")
        return super().write_pass(read, plan)


def test_a_finished_attempt_waits_out_a_store_outage_instead_of_losing_its_outcome() -> None:
    store = _FlakyStore(failures=3)
    h = _harness(store)

    @h.task
    def work() -> str:
        h.count("work")
        return "done"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("work", work)  # no retries: a lost outcome would fail the run

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == "done"
    assert store.failures == 0
    assert h.calls["work"] == 1  # the body ran once; only the write was retried
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.SUCCEEDED]


def test_a_lasting_outage_gives_up_after_outcome_retry() -> None:
    store = _FlakyStore(failures=1000)
    h = _harness(store)
    h.engine.outcome_retry = 0.3

    @h.task
    def work() -> str:
        return "done"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("work", work)

    wf.start()
    with pytest.raises(_Outage):
        h.run()
