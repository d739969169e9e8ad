"""The eager claim, on every store: a pass writes one new step already claimed.

The pass that records step N's outcome may write the next step running as
its first attempt, for the worker that passes (``Decision.eager``): in the
same commit as the outcome, under a claim id and a lease on the store's
clock, with an attempt row saying ``eager``. Nothing of it is published.
"""

from __future__ import annotations

import pytest

from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.model.values import EAGER, EagerClaim
from pikku_celery.store import (
    AdvanceResult,
    AttemptStatus,
    Decision,
    NewStep,
    RunState,
    RunStatus,
    RunView,
    StepOutcome,
    StepStatus,
    WorkflowStore,
    step_id_for,
)
from tests.store.support import LONG, TASK, claim, lapse, make_tasks, task, threaded


def eager(
    name: str, worker: str = "w-eager", lease: int = LONG, claim_id: str = "c" * 32
) -> EagerClaim:
    return EagerClaim(name, worker, lease, claim_id)


def pass_claiming(
    store: WorkflowStore, eager_name: str, *new: NewStep, lease: int = LONG
) -> tuple[RunState, AdvanceResult]:
    """A run whose first step's outcome is recorded by a pass that records
    ``new`` (one task step "next" by default) and claims ``eager_name``."""
    run, [first] = make_tasks(store, 1)
    running = claim(store, first, "w-broker")
    steps = list(new) or [task("next", 1)]
    result = threaded(store).take_pass(
        run.id,
        StepOutcome(first.id, running.attempt, ok=True),
        lambda view: Decision(new_steps=steps, eager=eager(eager_name, lease=lease)),
    )
    return run, result


def test_the_pass_writes_the_named_step_claimed_and_publishes_the_rest(
    store: WorkflowStore,
) -> None:
    run, [first] = make_tasks(store, 1)
    running = claim(store, first, "w-broker")
    before = store.now_ms()

    def decide(view: RunView) -> Decision:
        return Decision(
            new_steps=[task("a", 1), task("b", 2), task("c", 3)], eager=eager("b", lease=LONG)
        )

    result = threaded(store).take_pass(
        run.id, StepOutcome(first.id, running.attempt, ok=True, result=1), decide
    )
    after = store.now_ms()
    assert result.eager is not None
    claimed = result.eager
    assert claimed.name == "b" and claimed.status == StepStatus.RUNNING
    assert claimed.attempt == 1 and claimed.worker == "w-eager"
    assert claimed.claim_id == "c" * 32
    assert claimed.lease_expires_at is not None
    assert before + LONG <= claimed.lease_expires_at <= after + LONG
    assert sorted(s.name for s in result.steps) == ["a", "c"]  # published: the others only
    assert store.get_step(claimed.id) == claimed  # what the pass hands back is what is stored
    [row] = [a for a in store.get_attempts(run.id) if a.step_id == claimed.id]
    assert row.status == AttemptStatus.RUNNING and row.dispatch == EAGER
    assert row.claim_id == "c" * 32 and row.worker == "w-eager"
    assert store.get_step(first.id).status == StepStatus.SUCCEEDED  # type: ignore[union-attr]


def test_a_message_for_the_eager_step_finds_it_taken(store: WorkflowStore) -> None:
    run, result = pass_claiming(store, "next")
    assert result.eager is not None
    step_id = step_id_for(run.id, "next")
    assert threaded(store).claim(step_id, TASK, "w-other", LONG, run_id=run.id) is None
    assert store.get_step(step_id).attempt == 1  # type: ignore[union-attr]


def test_the_eager_attempts_outcome_is_fenced_on_its_claim_id(store: WorkflowStore) -> None:
    run, result = pass_claiming(store, "next")
    claimed = result.eager
    assert claimed is not None
    forged = StepOutcome(claimed.id, claimed.attempt, ok=True, result="x", claim_id="d" * 32)
    with pytest.raises(WorkflowStepSupersededError) as refused:
        threaded(store).take_pass(run.id, forged, lambda view: Decision())
    assert refused.value.claim_lost
    assert not store.refresh_step_lease(claimed.id, claimed.attempt, LONG, "d" * 32)
    assert store.refresh_step_lease(claimed.id, claimed.attempt, LONG, claimed.claim_id)
    done = StepOutcome(claimed.id, claimed.attempt, ok=True, result=2, claim_id=claimed.claim_id)
    ended = threaded(store).take_pass(
        run.id, done, lambda view: Decision(run_status=RunStatus.COMPLETED, output=2)
    )
    assert ended.run.status == RunStatus.COMPLETED
    [row] = [a for a in store.get_attempts(run.id) if a.step_id == claimed.id]
    assert row.status == AttemptStatus.SUCCEEDED and row.result == 2 and row.dispatch == EAGER


def test_a_lapsed_eager_claim_is_taken_over_by_attempt_two(store: WorkflowStore) -> None:
    """A worker that dies after the pass and before the step's end: the same
    as one that dies mid-step (the sweep finds the lapsed lease)."""
    run, result = pass_claiming(store, "next", task("next", 1, max_attempts=2), lease=300)
    claimed = result.eager
    assert claimed is not None
    lapse(store, claimed)
    assert [s.id for s in store.lapsed_steps(10)] == [claimed.id]
    second = claim(store, claimed, "w-second")
    assert second.attempt == 2 and second.claim_id != claimed.claim_id
    late = StepOutcome(claimed.id, 1, ok=True, result="late", claim_id=claimed.claim_id)
    with pytest.raises(WorkflowStepSupersededError):
        threaded(store).take_pass(run.id, late, lambda view: Decision())
    rows = {a.attempt: a for a in store.get_attempts(run.id) if a.step_id == claimed.id}
    assert rows[1].status == AttemptStatus.SUPERSEDED and rows[1].dispatch == EAGER
    assert rows[2].status == AttemptStatus.RUNNING and rows[2].dispatch != EAGER


def test_a_claim_naming_no_new_task_step_claims_nothing(store: WorkflowStore) -> None:
    run, result = pass_claiming(store, "elsewhere")
    assert result.eager is None
    assert [s.name for s in result.steps] == ["next"]
    assert store.get_step(step_id_for(run.id, "next")).status == StepStatus.SCHEDULED  # type: ignore[union-attr]
