"""plan_pass: what one pass writes, decided once, before any store sees it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pikku_celery.errors import (
    DuplicateStepError,
    PayloadError,
    StoreError,
    WorkflowStepSupersededError,
)
from pikku_celery.model.changes import run_created
from pikku_celery.model.plan import PassWrite, outcome_write, plan_pass, view_after
from pikku_celery.model.values import (
    AttemptStatus,
    Decision,
    EagerClaim,
    NewRun,
    NewStep,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepResolution,
    StepState,
    StepStatus,
    step_id_for,
)
from tests.store.support import TASK, task

NOW = 1_800_000_000_000
RUN = "6a0b7c3e-1d2f-4a5b-8c9d-0e1f2a3b4c5d"


def running(
    name: str, seq: int, attempt: int = 1, claim: str = "k" * 32, **kw: object
) -> StepState:
    fields: dict[str, object] = {
        "id": step_id_for(RUN, name),
        "run_id": RUN,
        "name": name,
        "seq": seq,
        "kind": StepKind.TASK,
        "status": StepStatus.RUNNING,
        "task_name": TASK,
        "attempt": attempt,
        "lease_expires_at": NOW + 60_000,
        "claim_id": claim,
        **kw,
    }
    return StepState(**fields)  # type: ignore[arg-type]


def view_of(*steps: StepState, parent: tuple[str, str] | None = None) -> RunView:
    new = NewRun(workflow="wf", input={"n": 1}, id=RUN)
    if parent is not None:
        new = replace(new, parent_run_id=parent[0], parent_step_id=parent[1], depth=1)
    return RunView(
        run=run_created(new, {"n": 1}, NOW - 1_000), steps=list(steps), signals={}, now=NOW
    )


def planned(view: RunView, outcome: StepOutcome | None, decision: Decision | None) -> PassWrite:
    written = None if outcome is None else outcome_write(view, outcome)
    return plan_pass(view_after(view, written), written, decision)


def test_an_outcome_is_checked_on_its_fence_and_the_decision_sees_it_written() -> None:
    step = running("a", 0)
    view = view_of(step)
    with pytest.raises(WorkflowStepSupersededError):
        outcome_write(view, StepOutcome(step.id, 2, ok=True, result=1))
    with pytest.raises(WorkflowStepSupersededError):
        outcome_write(view, StepOutcome(step.id, 1, ok=True, result=1, claim_id="z" * 32))
    written = outcome_write(view, StepOutcome(step.id, 1, ok=True, result=(1, 2)))
    assert (written.kind, json.loads(written.text)) == ("complete", [1, 2])
    seen = view_after(view, written)
    [done] = seen.steps
    assert (done.status, done.result, done.lease_expires_at) == (StepStatus.SUCCEEDED, [1, 2], None)


def test_a_failure_with_attempts_left_waits_for_its_retry() -> None:
    step = running("a", 0, max_attempts=3)
    error = {"type": "E", "message": "m", "traceback": ""}
    written = outcome_write(
        view_of(step), StepOutcome(step.id, 1, ok=False, error=error, retry_delay=2.5)
    )
    assert (written.kind, written.delay_ms) == ("fail_retry", 2_500)
    assert written.step is not None
    assert (written.step.status, written.step.wake_at) == (StepStatus.FAILED, NOW + 2_500)
    final = outcome_write(view_of(step), StepOutcome(step.id, 1, ok=False, error=error))
    assert final.kind == "fail" and final.step is not None and final.step.wake_at is None


def test_new_task_steps_are_published_and_the_eager_one_is_written_claimed() -> None:
    claim = EagerClaim("b", "w-eager", 30_000, "c" * 32)
    decision = Decision(new_steps=[task("a", 0), task("b", 1), task("c", 2)], eager=claim)
    plan = planned(view_of(), None, decision)
    assert [s.name for s in plan.publish] == ["a", "c"]
    assert plan.eager is not None
    eager = plan.eager
    assert (eager.name, eager.status, eager.attempt) == ("b", StepStatus.RUNNING, 1)
    assert (eager.worker, eager.claim_id, eager.lease_expires_at) == (
        "w-eager",
        "c" * 32,
        NOW + 30_000,
    )
    [row] = [r for r in plan.inserts if r.attempt is not None]
    assert row.attempt is not None
    assert (row.attempt.dispatch, row.attempt.status, row.attempt.claim_id) == (
        "eager",
        AttemptStatus.RUNNING,
        "c" * 32,
    )
    assert (plan.run.version, plan.run.updated_at) == (2, NOW)


def test_an_eager_claim_names_only_a_task_step() -> None:
    decision = Decision(
        new_steps=[NewStep("nap", 0, StepKind.SLEEP, wake_at=NOW + 5)],
        eager=EagerClaim("nap", "w", 1_000, "c" * 32),
    )
    plan = planned(view_of(), None, decision)
    assert plan.eager is None and plan.publish == ()


def test_a_value_step_is_recorded_settled_and_a_child_step_parks_on_its_child() -> None:
    child = NewRun(workflow="kid", input=[1])
    decision = Decision(
        new_steps=[
            NewStep("v", 0, StepKind.VALUE, result={"at": 1}),
            NewStep("kid", 1, StepKind.CHILD, child=child),
        ]
    )
    plan = planned(view_of(), None, decision)
    value, kid = (row.step for row in plan.inserts)
    assert (value.status, value.result) == (StepStatus.SUCCEEDED, {"at": 1})
    assert (kid.status, kid.attempt, kid.lease_expires_at, kid.child_run_id) == (
        StepStatus.RUNNING,
        1,
        None,
        child.id,
    )
    [made] = [row.child for row in plan.inserts if row.child is not None]
    assert (made.parent_run_id, made.parent_step_id, made.depth) == (RUN, kid.id, 1)
    assert plan.children == [child.id] and plan.publish == ()


def test_resolutions_settle_open_steps_only_and_end_a_child_step_attempt() -> None:
    nap = StepState(step_id_for(RUN, "nap"), RUN, "nap", 0, StepKind.SLEEP, StepStatus.SCHEDULED)
    kid = StepState(
        step_id_for(RUN, "kid"), RUN, "kid", 1, StepKind.CHILD, StepStatus.RUNNING, attempt=1
    )
    old = StepState(step_id_for(RUN, "old"), RUN, "old", 2, StepKind.SLEEP, StepStatus.SUCCEEDED)
    decision = Decision(
        resolutions=[
            StepResolution(nap.id, True, None),
            StepResolution(kid.id, False, error={"type": "E", "message": "m", "traceback": ""}),
            StepResolution(old.id, True, "again"),
        ]
    )
    plan = planned(view_of(nap, kid, old), None, decision)
    assert [(r.step.name, r.step.status, r.attempt) for r in plan.resolved] == [
        ("nap", StepStatus.SUCCEEDED, None),
        ("kid", StepStatus.FAILED, AttemptStatus.FAILED),
    ]


def test_a_redispatched_step_is_published_again() -> None:
    failed = replace(running("a", 0, max_attempts=2), status=StepStatus.FAILED, wake_at=NOW - 1)
    plan = planned(view_of(failed), None, Decision(redispatch=[failed.id]))
    assert [(s.name, s.scheduled_at) for s in plan.publish] == [("a", NOW)]


def test_a_run_that_ends_keeps_its_outcome_and_settles_its_parent_step() -> None:
    parent = ("0b9f6a8e-2c4d-4e1f-9a3b-5c7d9e1f2a4b", "parent-step")
    plan = planned(
        view_of(parent=parent),
        None,
        Decision(run_status=RunStatus.COMPLETED, output={"r": 1}, wake_at=NOW + 5),
    )
    assert plan.ends and plan.close_open is None
    assert (plan.run.status, plan.run.output, plan.run.wake_at) == (
        RunStatus.COMPLETED,
        {"r": 1},
        None,
    )
    assert plan.output is not None and json.loads(plan.output) == {"r": 1}
    assert plan.parent is not None
    assert (plan.parent.run_id, plan.parent.step_id, plan.parent.ok, plan.parent.result) == (
        parent[0],
        parent[1],
        True,
        {"r": 1},
    )


def test_a_cancelled_run_closes_its_open_steps() -> None:
    plan = planned(view_of(running("a", 0)), None, Decision(run_status=RunStatus.CANCELLED))
    assert plan.close_open is not None and plan.close_open["type"] == "WorkflowCancelledError"
    assert plan.parent is None and plan.run.status == RunStatus.CANCELLED


def test_a_decision_no_store_can_write_is_refused_before_any_write() -> None:
    view = view_of(running("a", 0))
    with pytest.raises(DuplicateStepError):
        planned(view, None, Decision(new_steps=[task("a", 1)]))
    with pytest.raises(StoreError):
        planned(view, None, Decision(redispatch=["no-such-step"]))
    with pytest.raises(PayloadError):
        planned(view, None, Decision(run_status=RunStatus.COMPLETED, output=object()))


def test_with_no_decision_only_the_outcome_is_written() -> None:
    step = running("a", 0)
    plan = planned(view_of(step), StepOutcome(step.id, 1, ok=True, result=1), None)
    assert plan.decision is None and plan.run == plan.view.run
    assert plan.inserts == () and plan.publish == () and plan.outcome is not None
