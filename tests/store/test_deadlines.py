"""Run deadlines and step timeouts as every store keeps them (memory, SQLite,
PostgreSQL, MariaDB): the deadline is placed on the store's clock at creation,
the sweep's query finds runs past it, and the pass that fails a run for it
closes the run's open steps and asks its children to stop."""

from __future__ import annotations

from pikku_celery.engine.deadline import overdue, timed_out
from pikku_celery.engine.passes import take_pass
from pikku_celery.store import (
    AttemptStatus,
    Decision,
    NewRun,
    NewStep,
    RunStatus,
    RunView,
    StepKind,
    StepStatus,
    WorkflowStore,
)
from tests.helpers import wait_until
from tests.store.support import claim, make_run, make_tasks, record, task


def test_a_run_with_a_timeout_gets_its_deadline_on_the_stores_clock(
    store: WorkflowStore,
) -> None:
    for key in (None, "k"):  # the plain insert, and the one behind an idempotency key
        before = store.now_ms()
        run, created = store.create_run(
            NewRun(workflow="wf", input={}, timeout_ms=5_000, idempotency_key=key)
        )
        after = store.now_ms()
        assert created and run.deadline_at is not None
        assert run.deadline_at == run.created_at + 5_000
        assert before + 5_000 <= run.deadline_at <= after + 5_000
        stored = store.get_run(run.id)
        assert stored is not None and stored.deadline_at == run.deadline_at
    plain, _ = store.create_run(NewRun(workflow="wf", input={}))
    assert plain.deadline_at is None and store.get_run(plain.id).deadline_at is None  # type: ignore[union-attr]


def test_overdue_runs_are_found_once_their_deadline_passes_and_only_then(
    store: WorkflowStore,
) -> None:
    soon, _ = store.create_run(NewRun(workflow="wf", input={}, timeout_ms=100))
    late, _ = store.create_run(NewRun(workflow="wf", input={}, timeout_ms=3_600_000))
    store.create_run(NewRun(workflow="wf", input={}))  # no deadline
    wait_until(lambda: [r.id for r in store.overdue_runs(10)] == [soon.id], timeout=10)
    assert late.id not in [r.id for r in store.overdue_runs(10)]
    # the sweep backs a run off once it woke it
    assert store.note_swept(soon.id, 60_000)
    assert store.overdue_runs(10) == []


def test_a_run_failed_for_its_deadline_closes_its_open_steps_and_stops_its_children(
    store: WorkflowStore,
) -> None:
    run, [running, waiting] = make_tasks(store, 2)
    child = NewRun(workflow="child", input={})
    record(store, run.id, NewStep("kid", 2, StepKind.CHILD, StepStatus.PENDING, child=child))
    got = claim(store, running, "w")
    result = take_pass(store, run.id, None, timed_out)
    assert result.run.status == RunStatus.FAILED
    assert result.run.error is not None and result.run.error["type"] == "WorkflowDeadlineError"
    assert child.id in result.children_to_wake
    for step in (store.get_step(running.id), store.get_step(waiting.id)):
        assert step is not None and step.status == StepStatus.FAILED
        assert step.lease_expires_at is None and step.wake_at is None
        assert step.error is not None and step.error["type"] == "WorkflowDeadlineError"
    statuses = {a.step_id: a.status for a in store.get_attempts(run.id)}
    assert statuses[running.id] == AttemptStatus.CANCELLED
    assert store.refresh_step_lease(running.id, got.attempt, 60_000) is False
    kid = store.get_run(child.id)
    assert kid is not None and kid.cancel_requested
    assert store.lapsed_steps(100) == []


def test_a_pass_judges_the_deadline_on_the_stores_clock(store: WorkflowStore) -> None:
    run, _ = make_run(store, timeout_ms=150)
    seen: list[bool] = []

    def look(view: RunView) -> Decision:
        seen.append(overdue(view))
        return Decision()

    take_pass(store, run.id, None, look)
    assert run.deadline_at is not None
    wait_until(lambda: store.now_ms() >= (run.deadline_at or 0), timeout=10)
    take_pass(store, run.id, None, look)
    assert seen == [False, True]


def test_a_step_keeps_its_timeout(store: WorkflowStore) -> None:
    _, steps = make_run(store, task("limited", timeout_ms=2_500), task("free", 1))
    assert steps["limited"].timeout_ms == 2_500 and steps["free"].timeout_ms is None
    got = claim(store, steps["limited"], "w")
    assert got.timeout_ms == 2_500
