"""The store conformance suite: every store obeys DESIGN.md's rules 1-7.

Parametrised over memory, SQLite, PostgreSQL and MariaDB (see conftest.py),
and PostgreSQL again through PgBouncer in transaction pooling.
Leases lapse on the store's own clock; tests poll it with a deadline, never
sleep to synchronise. Races use real threads (separate connections) released
by one barrier.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pikku_celery.engine.passes import take_pass
from pikku_celery.engine.replay import cancelled
from pikku_celery.errors import (
    DuplicateStepError,
    PayloadError,
    RunNotFoundError,
    RunSettledError,
    SignalAlreadySentError,
    StoreError,
    WorkflowStepFunctionMismatchError,
    WorkflowStepSupersededError,
)
from pikku_celery.store import (
    AttemptStatus,
    Decision,
    InMemoryWorkflowStore,
    NewRun,
    NewStep,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepResolution,
    StepStatus,
    WorkflowStore,
    step_id_for,
)
from tests.helpers import wait_until
from tests.store.conftest import BACKENDS, POOLED
from tests.store.support import (
    LONG,
    SHORT,
    TASK,
    claim,
    lapse,
    make_run,
    make_tasks,
    race,
    record,
    task,
)


@pytest.fixture(params=[*BACKENDS, POOLED])
def backend(request: pytest.FixtureRequest) -> str:
    """Every store, and the PostgreSQL one through PgBouncer (transaction pooling)."""
    return str(request.param)


def seen_by(views: list[RunView], decision: Decision | None = None) -> Any:
    """A decide function that records the views it is shown."""

    def decide(view: RunView) -> Decision:
        views.append(view)
        return decision if decision is not None else Decision()

    return decide


def attempts_of(store: WorkflowStore, run_id: str, step_id: str) -> dict[int, Any]:
    return {a.attempt: a for a in store.get_attempts(run_id) if a.step_id == step_id}


def test_is_a_workflow_store(store: WorkflowStore) -> None:
    assert isinstance(store, WorkflowStore)
    now = store.now_ms()
    assert abs(now - store.now_ms()) < 5_000
    assert now > 1_700_000_000_000  # epoch milliseconds


# --- rule 1: the claim is one guarded write ------------------------------------


def test_claim_fresh_step_writes_lease_on_store_clock(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    assert step.status == StepStatus.SCHEDULED and step.attempt == 0
    before = store.now_ms()
    got = claim(store, step, "w1", lease=5_000)
    after = store.now_ms()
    assert got.status == StepStatus.RUNNING and got.attempt == 1 and got.worker == "w1"
    assert got.lease_expires_at is not None
    assert before + 5_000 <= got.lease_expires_at <= after + 5_000
    assert store.get_step(step.id) == got
    [row] = store.get_attempts(run.id)
    assert (row.step_id, row.attempt, row.status, row.worker) == (
        step.id,
        1,
        AttemptStatus.RUNNING,
        "w1",
    )
    assert row.result is None and row.finished_at is None


def test_two_threads_claiming_one_step_exactly_one_wins_50_times(store: WorkflowStore) -> None:
    run, steps = make_tasks(store, 50, max_attempts=3)
    for step in steps:
        results = race(
            lambda s=step: store.claim_step(s.id, TASK, "a", LONG),  # type: ignore[misc]
            lambda s=step: store.claim_step(s.id, TASK, "b", LONG),  # type: ignore[misc]
        )
        assert all(kind == "ok" for kind, _ in results), results
        winners = [value for _, value in results if value is not None]
        assert len(winners) == 1, f"{step.name}: {results}"
        assert winners[0].attempt == 1
        assert store.get_step(step.id) == winners[0]
    assert len(store.get_attempts(run.id)) == 50


def test_live_lease_is_not_taken_but_a_lapsed_one_is(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    first = claim(store, step, "a", lease=SHORT)
    assert store.claim_step(step.id, TASK, "b", LONG) is None
    lapse(store, first)
    second = claim(store, step, "b")
    assert second.attempt == 2 and second.worker == "b"
    rows = attempts_of(store, run.id, step.id)
    assert rows[1].status == AttemptStatus.SUPERSEDED
    assert rows[2].status == AttemptStatus.RUNNING and rows[2].worker == "b"


# --- rule 2: outcome writes are fenced ----------------------------------------


def test_stale_result_is_refused_and_current_lands(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    stale = claim(store, step, "a", lease=SHORT)
    lapse(store, stale)
    current = claim(store, step, "b")
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, stale.attempt, {"from": "stale"})
    assert store.get_step(step.id) == current  # nothing changed
    store.complete_step(step.id, current.attempt, {"from": "current"})
    done = store.get_step(step.id)
    assert done is not None
    assert done.status == StepStatus.SUCCEEDED and done.result == {"from": "current"}
    assert done.lease_expires_at is None
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, stale.attempt, {"from": "stale"})
    rows = attempts_of(store, run.id, step.id)
    assert rows[1].status == AttemptStatus.SUPERSEDED and rows[1].result is None
    assert rows[2].status == AttemptStatus.SUCCEEDED and rows[2].result == {"from": "current"}
    assert rows[2].finished_at is not None


def test_stale_error_does_not_fail_the_step(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    stale = claim(store, step, "a", lease=SHORT)
    lapse(store, stale)
    current = claim(store, step, "b")
    err = {"type": "Boom", "message": "stale", "traceback": ""}
    with pytest.raises(WorkflowStepSupersededError):
        store.fail_step(step.id, stale.attempt, err)
    with pytest.raises(WorkflowStepSupersededError):
        store.fail_step(step.id, stale.attempt, err, retry_delay=1.0)
    assert store.get_step(step.id) == current
    rows = attempts_of(store, run.id, step.id)
    assert rows[1].error is None and rows[2].error is None
    assert rows[2].status == AttemptStatus.RUNNING


def test_outcome_of_a_step_never_claimed_is_refused(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, 0, "x")
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step_id_for(run.id, "nope"), 1, "x")
    assert store.get_step(step.id) == step


def test_third_claim_fences_out_both_earlier_ones(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    first = claim(store, step, "a", lease=SHORT)
    lapse(store, first)
    second = claim(store, step, "b", lease=SHORT)
    lapse(store, second)
    third = claim(store, step, "c")
    assert [first.attempt, second.attempt, third.attempt] == [1, 2, 3]
    for old in (first, second):
        with pytest.raises(WorkflowStepSupersededError):
            store.complete_step(step.id, old.attempt, f"from {old.worker}")
        with pytest.raises(WorkflowStepSupersededError):
            store.fail_step(step.id, old.attempt, {"type": "E", "message": "", "traceback": ""})
        assert store.refresh_step_lease(step.id, old.attempt, LONG) is False
    store.complete_step(step.id, third.attempt, "from c")
    rows = attempts_of(store, run.id, step.id)
    assert [rows[i].status for i in (1, 2, 3)] == [
        AttemptStatus.SUPERSEDED,
        AttemptStatus.SUPERSEDED,
        AttemptStatus.SUCCEEDED,
    ]
    assert [rows[i].result for i in (1, 2, 3)] == [None, None, "from c"]


def test_25_races_of_stale_and_current_writes_only_current_lands(store: WorkflowStore) -> None:
    run, steps = make_tasks(store, 25, max_attempts=2)
    stale = [claim(store, s, "stale", lease=SHORT) for s in steps]
    lapse(store, *stale)
    current = [claim(store, s, "current") for s in steps]
    err = {"type": "Stale", "message": "stale", "traceback": ""}

    def via_advance(step_id: str, attempt: int, ok: bool, value: Any) -> None:
        outcome = StepOutcome(step_id, attempt, ok=ok, result=value, error=None if ok else err)
        take_pass(store, run.id, outcome, lambda view: Decision())

    for i, (old, new) in enumerate(zip(stale, current, strict=True)):
        stale_write = [
            lambda o=old: store.complete_step(o.id, o.attempt, "stale"),
            lambda o=old: store.fail_step(o.id, o.attempt, err, retry_delay=0.0),
            lambda o=old: via_advance(o.id, o.attempt, True, "stale"),
            lambda o=old: via_advance(o.id, o.attempt, False, None),
        ][i % 4]
        current_write = (
            (lambda n=new: store.complete_step(n.id, n.attempt, "current"))
            if i % 2
            else (lambda n=new: via_advance(n.id, n.attempt, True, "current"))
        )
        (s_kind, s_val), (c_kind, c_val) = race(stale_write, current_write)
        assert s_kind == "err" and isinstance(s_val, WorkflowStepSupersededError), (i, s_val)
        assert c_kind == "ok", (i, c_val)
        got = store.get_step(new.id)
        assert got is not None
        assert (got.status, got.result, got.error, got.attempt) == (
            StepStatus.SUCCEEDED,
            "current",
            None,
            2,
        )
        rows = attempts_of(store, run.id, new.id)
        assert rows[1].status == AttemptStatus.SUPERSEDED
        assert rows[1].result is None and rows[1].error is None
        assert rows[2].status == AttemptStatus.SUCCEEDED and rows[2].result == "current"


# --- rule 3: renewal is fenced; None parks -------------------------------------


def test_refresh_extends_on_store_clock(store: WorkflowStore) -> None:
    _, [step] = make_tasks(store, 1)
    held = claim(store, step, "a", lease=5_000)
    assert store.refresh_step_lease(step.id, held.attempt, 20_000) is True
    now = store.now_ms()
    got = store.get_step(step.id)
    assert got is not None and got.lease_expires_at is not None
    assert now + 15_000 <= got.lease_expires_at <= now + 20_000


def test_stale_attempt_cannot_renew_or_release(store: WorkflowStore) -> None:
    _, [step] = make_tasks(store, 1, max_attempts=2)
    stale = claim(store, step, "a", lease=SHORT)
    lapse(store, stale)
    # lapsed, not yet taken over: still cannot stretch its lease
    assert store.refresh_step_lease(step.id, stale.attempt, LONG) is False
    current = claim(store, step, "b")
    assert store.refresh_step_lease(step.id, stale.attempt, LONG) is False
    assert store.refresh_step_lease(step.id, stale.attempt, None) is False  # release/park
    assert store.get_step(step.id) == current
    assert store.refresh_step_lease(step.id, current.attempt, LONG) is True


def test_each_attempt_counts_its_own_renewals(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=2)
    lease = 4 * SHORT  # renewed twice before it lapses, even on a loaded machine
    first = claim(store, step, "a", lease=lease)
    assert store.refresh_step_lease(step.id, first.attempt, lease) is True
    assert store.refresh_step_lease(step.id, first.attempt, lease) is True
    renewed = store.get_step(step.id)
    assert renewed is not None
    lapse(store, renewed)
    assert store.refresh_step_lease(step.id, first.attempt, LONG) is False  # not counted
    second = claim(store, step, "b")
    assert store.refresh_step_lease(step.id, first.attempt, LONG) is False  # superseded
    assert store.refresh_step_lease(step.id, second.attempt, None) is True  # a park is none
    assert store.refresh_step_lease(step.id, second.attempt, LONG) is True
    after = store.get_step(step.id)
    assert after is not None
    by_attempt = {a.attempt: a for a in store.get_attempts(run.id)}
    assert by_attempt[first.attempt].renewals == 2
    assert by_attempt[first.attempt].renewed_at == renewed.updated_at  # on the store's clock
    assert by_attempt[second.attempt].renewals == 1
    assert by_attempt[second.attempt].renewed_at == after.updated_at


def test_parked_step_is_never_reclaimed_nor_listed(store: WorkflowStore) -> None:
    _, [step] = make_tasks(store, 1, max_attempts=5)
    held = claim(store, step, "a", lease=SHORT)
    assert store.refresh_step_lease(step.id, held.attempt, None) is True
    parked = store.get_step(step.id)
    assert parked is not None and parked.lease_expires_at is None
    lapse(store, held)  # well past the lease it had
    assert store.claim_step(step.id, TASK, "b", LONG) is None
    assert step.id not in {s.id for s in store.lapsed_steps(100)}
    assert store.expire_step(step.id) is False
    assert store.get_step(step.id) == parked
    # its own attempt may take a lease again
    assert store.refresh_step_lease(step.id, held.attempt, LONG) is True


def test_child_step_is_parked_and_never_claimed(store: WorkflowStore) -> None:
    _, steps = make_run(
        store,
        NewStep(name="kid", seq=0, kind=StepKind.CHILD, child=NewRun(workflow="child", input=1)),
    )
    kid = steps["kid"]
    assert kid.status == StepStatus.RUNNING and kid.lease_expires_at is None
    with pytest.raises(WorkflowStepFunctionMismatchError):
        store.claim_step(kid.id, TASK, "w", LONG)
    assert kid.id not in {s.id for s in store.lapsed_steps(100)}
    assert store.get_step(kid.id) == kid


# --- a step addressed with a run it is not of (a stale or forged message) -----


def test_a_step_named_with_another_run_is_never_touched(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    other, _ = make_tasks(store, 1)
    err = {"type": "E", "message": "forged", "traceback": ""}
    assert store.get_step(step.id, run_id=other.id) is None
    assert store.claim_step(step.id, TASK, "forged", LONG, run_id=other.id) is None
    # another task's name too: the step is not there, so nothing to refuse
    assert store.claim_step(step.id, "tasks.other", "forged", LONG, run_id=other.id) is None
    assert store.get_step(step.id, run_id=run.id) == step  # not claimed
    held = claim(store, step, "mine")
    for lease in (LONG, None):  # a renewal, a park
        renewed = store.refresh_step_lease(
            step.id, held.attempt, lease, held.claim_id, run_id=other.id
        )
        assert renewed is False
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, held.attempt, "forged", held.claim_id, run_id=other.id)
    for delay in (None, 0.0):
        with pytest.raises(WorkflowStepSupersededError):
            store.fail_step(step.id, held.attempt, err, delay, held.claim_id, run_id=other.id)
    assert store.get_step(step.id, run_id=run.id) == held
    [row] = store.get_attempts(run.id)
    assert row.status == AttemptStatus.RUNNING and row.renewals == 0 and row.result is None
    # its own run's calls still hold
    assert store.refresh_step_lease(step.id, held.attempt, LONG, held.claim_id, run_id=run.id)
    store.complete_step(step.id, held.attempt, "mine", held.claim_id, run_id=run.id)
    done = store.get_step(step.id, run_id=run.id)
    assert done is not None and done.status == StepStatus.SUCCEEDED and done.result == "mine"


def test_a_lapsed_step_named_with_another_run_is_neither_taken_nor_expired(
    store: WorkflowStore,
) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=2)
    other, _ = make_tasks(store, 1)
    first = claim(store, step, "a", lease=SHORT)
    lapse(store, first)
    assert store.claim_step(step.id, TASK, "forged", LONG, run_id=other.id) is None
    second = store.claim_step(step.id, TASK, "b", SHORT, run_id=run.id)
    assert second is not None and second.attempt == 2
    lapse(store, second)
    assert store.expire_step(step.id, run_id=other.id) is False
    assert store.get_step(step.id, run_id=run.id) == second
    assert store.expire_step(step.id, run_id=run.id) is True
    rows = attempts_of(store, run.id, step.id)
    assert rows[1].status == AttemptStatus.SUPERSEDED
    assert rows[2].status == AttemptStatus.LEASE_EXPIRED


def test_a_caller_that_does_not_name_the_run_addresses_the_step_alone(
    store: WorkflowStore,
) -> None:
    run, [step] = make_tasks(store, 1)
    missing = step_id_for(run.id, "nope")
    assert store.get_step(missing) is None
    assert store.claim_step(missing, TASK, "w", LONG) is None
    assert store.refresh_step_lease(missing, 1, LONG) is False
    assert store.expire_step(missing) is False
    with pytest.raises(WorkflowStepSupersededError):
        store.fail_step(missing, 1, {"type": "E", "message": "", "traceback": ""})
    held = store.claim_step(step.id, TASK, "w", LONG)
    assert held is not None and held.run_id == run.id
    assert store.refresh_step_lease(step.id, held.attempt, LONG, held.claim_id) is True
    store.complete_step(step.id, held.attempt, "ok", held.claim_id)
    assert store.get_step(step.id) == store.get_step(step.id, run_id=run.id)


# --- rule 5: attempts are finite ----------------------------------------------


def test_exhausted_attempts_expire_with_lease_expired_error(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=2)
    first = claim(store, step, "a", lease=SHORT)
    assert store.expire_step(step.id) is False  # live
    lapse(store, first)
    assert store.expire_step(step.id) is False  # attempts left
    second = claim(store, step, "b", lease=SHORT)
    lapse(store, second)
    assert store.claim_step(step.id, TASK, "c", LONG) is None  # no attempts left
    assert [s.id for s in store.lapsed_steps(100)] == [step.id]
    assert store.expire_step(step.id) is True
    assert store.expire_step(step.id) is False
    failed = store.get_step(step.id)
    assert failed is not None and failed.settled
    assert failed.status == StepStatus.FAILED and failed.attempt == 2
    assert failed.error is not None and failed.error["type"] == "WorkflowStepLeaseExpiredError"
    assert failed.lease_expires_at is None and failed.wake_at is None
    assert store.claim_step(step.id, TASK, "d", LONG) is None
    assert store.lapsed_steps(100) == []
    rows = attempts_of(store, run.id, step.id)
    assert rows[1].status == AttemptStatus.SUPERSEDED
    assert rows[2].status == AttemptStatus.LEASE_EXPIRED
    assert rows[2].error == failed.error and rows[2].finished_at is not None
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, second.attempt, "too late")


def test_redelivered_claim_of_settled_step_returns_none(store: WorkflowStore) -> None:
    _, (ok, bad) = make_tasks(store, 2, max_attempts=3)
    a = claim(store, ok, "w")
    store.complete_step(ok.id, a.attempt, 42)
    b = claim(store, bad, "w")
    store.fail_step(bad.id, b.attempt, {"type": "E", "message": "no", "traceback": ""})
    for step in (ok, bad):
        settled = store.get_step(step.id)
        assert store.claim_step(step.id, TASK, "again", LONG) is None
        assert store.get_step(step.id) == settled


def test_failure_with_retry_is_claimable_once_due(store: WorkflowStore) -> None:
    run, (late, soon) = make_tasks(store, 2, max_attempts=2)
    err = {"type": "E", "message": "try again", "traceback": ""}
    a = claim(store, late, "w")
    before = store.now_ms()
    store.fail_step(late.id, a.attempt, err, retry_delay=60.0)
    got = store.get_step(late.id)
    assert got is not None and got.status == StepStatus.FAILED and not got.settled
    assert got.scheduled_at is None  # its next attempt's message is not sent yet
    assert got.wake_at is not None and before + 60_000 <= got.wake_at <= store.now_ms() + 60_000
    assert store.claim_step(late.id, TASK, "w", LONG) is None  # not due yet
    assert late.id not in {s.id for s in store.due_steps(100)}

    b = claim(store, soon, "w")
    store.fail_step(soon.id, b.attempt, err, retry_delay=0.2)
    due = store.get_step(soon.id)
    assert due is not None and due.wake_at is not None
    wait_until(lambda: store.now_ms() >= due.wake_at)  # type: ignore[operator]
    assert soon.id in {s.id for s in store.due_steps(100)}
    again = claim(store, soon, "w2")
    assert again.attempt == 2 and again.error is None and again.wake_at is None
    rows = attempts_of(store, run.id, soon.id)
    assert rows[1].status == AttemptStatus.FAILED and rows[1].error == err
    # the last attempt's retry request cannot buy another attempt
    store.fail_step(soon.id, again.attempt, err, retry_delay=0.0)
    final = store.get_step(soon.id)
    assert final is not None and final.settled and final.wake_at is None
    assert store.claim_step(soon.id, TASK, "w3", LONG) is None


# --- rule 6: a step runs the task it was dispatched with ------------------------


def test_task_name_mismatch_is_refused(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    with pytest.raises(WorkflowStepFunctionMismatchError) as info:
        store.claim_step(step.id, "tasks.other", "w", LONG)
    assert info.value.recorded == TASK and info.value.received == "tasks.other"
    assert store.get_step(step.id) == step
    assert store.get_attempts(run.id) == []
    assert store.claim_step(step_id_for(run.id, "nope"), TASK, "w", LONG) is None


# --- rule 7: history is append-only per attempt --------------------------------


def test_history_keeps_one_row_per_attempt(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    err = {"type": "E", "message": "first", "traceback": "tb"}
    a = claim(store, step, "w1")
    store.fail_step(step.id, a.attempt, err, retry_delay=0.0)
    b = claim(store, step, "w2")
    store.complete_step(step.id, b.attempt, {"ok": True})
    rows = store.get_attempts(run.id)
    assert [(r.attempt, r.status, r.worker) for r in rows] == [
        (1, AttemptStatus.FAILED, "w1"),
        (2, AttemptStatus.SUCCEEDED, "w2"),
    ]
    assert rows[0].error == err and rows[0].result is None
    assert rows[1].result == {"ok": True} and rows[1].error is None
    assert rows[0].started_at <= rows[1].started_at
    now = store.get_step(step.id)
    assert now is not None and now.attempt == 2 and now.result == {"ok": True}


def test_a_runs_steps_read_a_page_at_a_time_with_their_attempts(store: WorkflowStore) -> None:
    run, steps = make_tasks(store, 5, max_attempts=3)
    for step, tries in zip(steps, [0, 1, 2, 1, 1], strict=True):
        for _ in range(tries):
            a = claim(store, step, "w")
            store.fail_step(step.id, a.attempt, {"type": "E", "message": "m"}, retry_delay=0.0)
    first = store.get_steps_page(run.id, None, 2)
    assert [s.id for s in first] == [steps[0].id, steps[1].id]
    second = store.get_steps_page(run.id, first[-1].seq, 2)
    assert [s.id for s in second] == [steps[2].id, steps[3].id]
    assert [s.id for s in store.get_steps_page(run.id, second[-1].seq, 2)] == [steps[4].id]
    assert store.get_steps_page(run.id, steps[4].seq, 2) == []
    assert store.get_steps_page(run.id, None, 10) == store.get_steps(run.id)
    page = store.get_attempts_page(run.id, first[-1].seq, second[-1].seq)
    assert sorted((a.step_id, a.attempt) for a in page) == sorted(
        [(steps[2].id, 1), (steps[2].id, 2), (steps[3].id, 1)]
    )
    everything = store.get_attempts_page(run.id, None, steps[4].seq)
    assert everything == store.get_attempts(run.id)


def test_a_runs_step_outlines_are_its_steps_without_their_payloads(store: WorkflowStore) -> None:
    run, [done, failed, waiting] = make_tasks(store, 3)
    a = claim(store, done, "w")
    store.complete_step(done.id, a.attempt, {"big": "x" * 1000})
    b = claim(store, failed, "w")
    store.fail_step(failed.id, b.attempt, {"type": "E", "message": "m"})
    whole = store.get_steps(run.id)
    outlines = store.get_step_outlines(run.id)
    assert [(s.id, s.seq, s.status, s.kind, s.wake_at) for s in outlines] == [
        (s.id, s.seq, s.status, s.kind, s.wake_at) for s in whole
    ]
    assert [o.status for o in outlines] == [
        StepStatus.SUCCEEDED,
        StepStatus.FAILED,
        whole[2].status,
    ]
    assert all(o.result is None and o.error is None and o.args == [] for o in outlines)
    assert whole[0].result == {"big": "x" * 1000} and waiting.id == whole[2].id


def test_mark_scheduled(store: WorkflowStore) -> None:
    run, steps = make_run(
        store,
        task("pending", 0, status=StepStatus.PENDING),
        task("running", 1),
        task("done", 2),
        task("retrying", 3, max_attempts=2),
    )
    assert steps["pending"].status == StepStatus.PENDING and steps["pending"].scheduled_at is None
    running = claim(store, steps["running"], "w")
    done = claim(store, steps["done"], "w")
    store.complete_step(done.id, done.attempt, None)
    retrying = claim(store, steps["retrying"], "w")
    store.fail_step(retrying.id, 1, {"type": "E", "message": "", "traceback": ""}, 30.0)
    before = {s.name: s for s in store.get_steps(run.id)}
    wait_until(lambda: store.now_ms() > max(s.updated_at for s in before.values()))
    store.mark_scheduled([s.id for s in before.values()] + [step_id_for(run.id, "ghost")])
    store.mark_scheduled([])
    after = {s.name: s for s in store.get_steps(run.id)}
    assert after["pending"].status == StepStatus.SCHEDULED
    assert after["pending"].scheduled_at is not None
    assert after["running"] == before["running"] and running.status == StepStatus.RUNNING
    assert after["done"] == before["done"]
    assert after["retrying"].status == StepStatus.FAILED
    assert (after["retrying"].scheduled_at or 0) > (before["retrying"].scheduled_at or 0)


# --- runs ----------------------------------------------------------------------


def test_create_run_is_idempotent_per_workflow_and_key(store: WorkflowStore) -> None:
    first, created = store.create_run(NewRun("wf", {"a": (1, 2)}, idempotency_key="k"))
    assert created and first.status == RunStatus.RUNNING and first.version == 1
    assert first.input == {"a": [1, 2]}  # as it comes back from storage
    again, created = store.create_run(NewRun("wf", {"other": 1}, idempotency_key="k"))
    assert not created and again == first
    other_wf, created = store.create_run(NewRun("wf2", {}, idempotency_key="k"))
    assert created and other_wf.id != first.id
    other_key, created = store.create_run(NewRun("wf", {}, idempotency_key="K"))
    assert created and other_key.id != first.id  # keys compare exactly
    free1, c1 = store.create_run(NewRun("wf", {}))
    free2, c2 = store.create_run(NewRun("wf", {}))
    assert c1 and c2 and free1.id != free2.id
    assert store.get_run(first.id) == first
    assert store.get_run("00000000-0000-0000-0000-000000000000") is None
    with pytest.raises(StoreError):
        store.create_run(NewRun("wf", {}, id=free1.id))


def test_concurrent_starts_with_one_key_make_one_run(store: WorkflowStore) -> None:
    results = race(*[lambda: store.create_run(NewRun("wf", {"x": 1}, idempotency_key="same"))] * 8)
    assert all(kind == "ok" for kind, _ in results), results
    runs = [value for _, value in results]
    assert sum(created for _, created in runs) == 1
    assert len({run.id for run, _ in runs}) == 1


def test_list_runs_filters_and_pages(store: WorkflowStore) -> None:
    made: list[Any] = []
    for i in range(6):
        if made:
            wait_until(lambda: store.now_ms() > made[-1].created_at)
        run, _ = store.create_run(NewRun("even" if i % 2 == 0 else "odd", {"i": i}))
        made.append(run)
    record(store, made[0].id, run_status=RunStatus.COMPLETED, output="done")
    record(store, made[3].id, run_status=RunStatus.FAILED, error={"type": "E", "message": ""})
    newest_first = [r.id for r in reversed(made)]
    assert [r.id for r in store.list_runs()] == newest_first
    assert [r.id for r in store.list_runs(limit=2)] == newest_first[:2]
    assert [r.id for r in store.list_runs(limit=2, offset=2)] == newest_first[2:4]
    assert [r.id for r in store.list_runs(workflow="even")] == [made[4].id, made[2].id, made[0].id]
    assert [r.id for r in store.list_runs(status=RunStatus.COMPLETED)] == [made[0].id]
    assert [r.id for r in store.list_runs(status=RunStatus.RUNNING, workflow="odd")] == [
        made[5].id,
        made[1].id,
    ]
    since, until = made[1].created_at, made[4].created_at
    assert [r.id for r in store.list_runs(since=since, until=until)] == [
        made[3].id,
        made[2].id,
        made[1].id,
    ]
    assert store.list_runs(workflow="nope") == []


def test_count_runs_by_status_takes_the_listing_filters_but_status(store: WorkflowStore) -> None:
    assert store.count_runs_by_status() == dict.fromkeys(RunStatus, 0)
    made: list[Any] = []
    for i in range(5):
        if made:
            wait_until(lambda: store.now_ms() > made[-1].created_at)
        run, _ = store.create_run(NewRun("even" if i % 2 == 0 else "odd", {"i": i}))
        made.append(run)
    record(store, made[0].id, run_status=RunStatus.COMPLETED, output="done")
    record(store, made[2].id, run_status=RunStatus.FAILED, error={"type": "E", "message": ""})
    counts = store.count_runs_by_status()
    assert set(counts) == set(RunStatus)
    assert counts[RunStatus.RUNNING] == 3 and counts[RunStatus.COMPLETED] == 1
    assert counts[RunStatus.FAILED] == 1 and counts[RunStatus.CANCELLED] == 0
    even = store.count_runs_by_status(workflow="even")
    assert (even[RunStatus.RUNNING], even[RunStatus.COMPLETED], even[RunStatus.FAILED]) == (1, 1, 1)
    window = store.count_runs_by_status(since=made[1].created_at, until=made[4].created_at)
    assert sum(window.values()) == 3 and window[RunStatus.FAILED] == 1
    assert sum(store.count_runs_by_status(workflow="nope").values()) == 0


def test_runs_with_key_finds_a_key_across_workflows_newest_first(store: WorkflowStore) -> None:
    first, _ = store.create_run(NewRun("a", {}, idempotency_key="order-7"))
    wait_until(lambda: store.now_ms() > first.created_at)
    second, _ = store.create_run(NewRun("b", {}, idempotency_key="order-7"))
    store.create_run(NewRun("a", {}, idempotency_key="order-7 "))  # keys compare exactly
    store.create_run(NewRun("a", {}))
    assert [r.id for r in store.runs_with_key("order-7")] == [second.id, first.id]
    assert [r.id for r in store.runs_with_key("order-7", limit=1)] == [second.id]
    assert store.runs_with_key("ORDER-7") == []


def test_get_signals_returns_the_first_payload_of_each_name(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    assert store.get_signals(run.id) == {}
    store.send_signal(run.id, "approve", {"by": "ann"})
    with pytest.raises(SignalAlreadySentError):  # the first one of a name stands
        store.send_signal(run.id, "approve", {"by": "bob"})
    store.send_signal(run.id, "note", [1, "two"])
    assert store.get_signals(run.id) == {"approve": {"by": "ann"}, "note": [1, "two"]}
    assert store.get_signals("00000000-0000-0000-0000-000000000000") == {}


def test_request_cancel(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    flagged = store.request_cancel(run.id)
    assert flagged.cancel_requested and flagged.version == run.version + 1
    assert flagged.status == RunStatus.RUNNING
    assert store.request_cancel(run.id) == flagged  # already requested: unchanged
    assert store.get_run(run.id) == flagged
    ended, _ = make_run(store)
    record(store, ended.id, run_status=RunStatus.COMPLETED, output=1)
    settled = store.get_run(ended.id)
    assert store.request_cancel(ended.id) == settled
    with pytest.raises(RunNotFoundError):
        store.request_cancel("00000000-0000-0000-0000-000000000000")


def test_signals_first_one_wins_and_reach_the_pass(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    after = store.send_signal(run.id, "approve", {"by": "ann"})
    assert after.version == run.version + 1
    again = store.send_signal(run.id, "approve", {"by": "ann"})  # a resend: taken
    assert again.version == after.version + 1
    with pytest.raises(SignalAlreadySentError):
        store.send_signal(run.id, "approve", {"by": "bob"})
    assert store.get_run(run.id) == again  # refused: nothing changed
    store.send_signal(run.id, "other", [1, 2])
    seen: list[RunView] = []
    take_pass(store, run.id, None, seen_by(seen))
    assert seen[0].signals == {"approve": {"by": "ann"}, "other": [1, 2]}
    with pytest.raises(PayloadError):
        store.send_signal(run.id, "bad", {"when": object()})
    current = store.get_run(run.id)
    take_pass(store, run.id, None, seen_by(seen))
    assert "bad" not in seen[1].signals and seen[1].run == current
    with pytest.raises(RunNotFoundError):
        store.send_signal("00000000-0000-0000-0000-000000000000", "x", 1)
    record(store, run.id, run_status=RunStatus.CANCELLED)
    with pytest.raises(RunSettledError):
        store.send_signal(run.id, "late", 1)


def test_retry_run_reopens_failed_steps(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=1)
    got = claim(store, step, "w")
    store.fail_step(step.id, got.attempt, {"type": "E", "message": "x", "traceback": ""})
    with pytest.raises(RunSettledError):
        store.retry_run(run.id)  # still running
    record(store, run.id, run_status=RunStatus.FAILED, error={"type": "E", "message": "x"})
    reopened = store.retry_run(run.id)
    assert reopened.status == RunStatus.RUNNING and reopened.error is None
    assert reopened.wake_at is not None
    again = claim(store, step, "w2")
    assert again.attempt == 2 and again.max_attempts == 2
    with pytest.raises(RunNotFoundError):
        store.retry_run("00000000-0000-0000-0000-000000000000")


# --- the orchestration pass ----------------------------------------------------


def test_advance_records_steps_and_publishes_scheduled_tasks(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    views: list[RunView] = []
    wake = store.now_ms() + 60_000

    def first(view: RunView) -> Decision:
        views.append(view)
        return Decision(
            new_steps=[
                task("a", 0, args=[1, (2, 3)], kwargs={"k": "v"}, queue="q1", max_attempts=3),
                task("b", 1, status=StepStatus.PENDING),
                NewStep(name="now", seq=2, kind=StepKind.VALUE, result={"t": 5}),
                NewStep(name="nap", seq=3, kind=StepKind.SLEEP, wake_at=wake),
            ],
            wake_at=wake,
        )

    result = take_pass(store, run.id, None, first)
    [view] = views
    assert view.steps == [] and view.signals == {} and view.run == run
    assert abs(view.now - store.now_ms()) < 5_000
    assert [s.name for s in result.steps] == ["a"]  # only scheduled tasks are published
    a = result.steps[0]
    assert (a.args, a.kwargs, a.queue, a.max_attempts, a.attempt) == (
        [1, [2, 3]],
        {"k": "v"},
        "q1",
        3,
        0,
    )
    assert a.id == step_id_for(run.id, "a") and a.scheduled_at == view.now
    assert result.run.version == run.version + 1 and result.run.wake_at == wake
    assert result.run.updated_at == view.now
    assert store.get_run(run.id) == result.run
    steps = {s.name: s for s in store.get_steps(run.id)}
    assert [s.name for s in store.get_steps(run.id)] == ["a", "b", "now", "nap"]
    assert steps["a"] == a
    assert steps["b"].status == StepStatus.PENDING and steps["b"].scheduled_at is None
    assert steps["now"].status == StepStatus.SUCCEEDED and steps["now"].result == {"t": 5}
    assert steps["nap"].status == StepStatus.SCHEDULED and steps["nap"].wake_at == wake
    second = take_pass(store, run.id, None, seen_by(views))
    assert views[1].steps == store.get_steps(run.id)
    assert second.steps == [] and second.run.wake_at is None


def test_advance_applies_outcome_fenced_and_shows_it_to_the_pass(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    stale = claim(store, step, "a", lease=SHORT)
    lapse(store, stale)
    current = claim(store, step, "b")
    called: list[RunView] = []

    def decide(view: RunView) -> Decision:
        called.append(view)
        return Decision(new_steps=[task("next", 1, max_attempts=2)])

    version = store.get_run(run.id).version  # type: ignore[union-attr]
    with pytest.raises(WorkflowStepSupersededError):
        take_pass(store, run.id, StepOutcome(step.id, stale.attempt, ok=True, result="x"), decide)
    assert called == [] and [s.name for s in store.get_steps(run.id)] == ["s0"]
    assert store.get_run(run.id).version == version  # type: ignore[union-attr]
    result = take_pass(
        store, run.id, StepOutcome(step.id, current.attempt, ok=True, result=[1]), decide
    )
    [view] = called
    assert view.steps[0].status == StepStatus.SUCCEEDED and view.steps[0].result == [1]
    assert view.steps[0] == store.get_step(step.id)
    assert [s.name for s in result.steps] == ["next"]
    rows = attempts_of(store, run.id, step.id)
    assert rows[2].status == AttemptStatus.SUCCEEDED and rows[2].result == [1]
    # a failure outcome with a retry keeps the step open, on the pass's clock
    nxt = claim(store, store.get_step(step_id_for(run.id, "next")), "c")  # type: ignore[arg-type]
    err = {"type": "E", "message": "m", "traceback": ""}
    take_pass(
        store,
        run.id,
        StepOutcome(nxt.id, nxt.attempt, ok=False, error=err, retry_delay=5.0),
        seen_by(called),
    )
    failed = called[-1].steps[1]
    assert failed.status == StepStatus.FAILED and failed.error == err
    assert failed.wake_at is not None
    assert called[-1].now - 1_000 <= failed.wake_at - 5_000 <= called[-1].now
    assert store.get_step(nxt.id) == failed


def test_cancel_closes_the_runs_open_steps_and_refuses_their_late_outcomes(
    store: WorkflowStore,
) -> None:
    run, [running, waiting] = make_tasks(store, 2)
    got = claim(store, running, "w")
    record(store, run.id, run_status=RunStatus.CANCELLED)
    for step in (store.get_step(running.id), store.get_step(waiting.id)):
        assert step is not None and step.status == StepStatus.FAILED
        assert step.lease_expires_at is None and step.wake_at is None
        assert step.error is not None and step.error["type"] == "WorkflowCancelledError"
    [attempt] = store.get_attempts(run.id)
    assert attempt.status == AttemptStatus.CANCELLED and attempt.finished_at is not None
    assert store.refresh_step_lease(running.id, got.attempt, 60_000) is False
    with pytest.raises(WorkflowStepSupersededError):
        take_pass(
            store, run.id, StepOutcome(running.id, got.attempt, ok=True, result=1), seen_by([])
        )
    assert store.get_step(running.id).status == StepStatus.FAILED  # type: ignore[union-attr]
    assert store.lapsed_steps(100) == []


def test_a_cancelling_pass_with_an_outcome_closes_the_other_open_steps(
    store: WorkflowStore,
) -> None:
    """The outcome of one of two steps in flight lands on a run being
    cancelled: the outcome is kept, the other step is closed (every store,
    whichever path its pass takes)."""
    run, [done, other] = make_tasks(store, 2)
    got = claim(store, done, "w1")
    claim(store, other, "w2")
    store.request_cancel(run.id)
    take_pass(store, run.id, StepOutcome(done.id, got.attempt, ok=True, result=7), cancelled)
    assert store.get_run(run.id).status == RunStatus.CANCELLED  # type: ignore[union-attr]
    kept = store.get_step(done.id)
    assert kept is not None and kept.status == StepStatus.SUCCEEDED and kept.result == 7
    closed = store.get_step(other.id)
    assert closed is not None and closed.status == StepStatus.FAILED
    assert closed.error is not None and closed.error["type"] == "WorkflowCancelledError"
    statuses = {a.step_id: a.status for a in store.get_attempts(run.id)}
    assert statuses == {done.id: AttemptStatus.SUCCEEDED, other.id: AttemptStatus.CANCELLED}


def test_advance_on_settled_run_records_outcome_but_decides_nothing(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    record(store, run.id, run_status=RunStatus.FAILED)
    ended = store.get_run(run.id)

    def never(view: RunView) -> Decision:
        # PostgreSQL's claim-time view may still show the run live, so a pure
        # decide can be asked; what it decides must never be applied.
        return Decision(new_steps=[task("after-the-end", 1)], run_status=RunStatus.COMPLETED)

    result = take_pass(store, run.id, StepOutcome(step.id, got.attempt, ok=True, result=1), never)
    assert result.decision is None and result.steps == [] and result.run == ended
    assert [s.name for s in store.get_steps(run.id)] == [step.name]
    assert store.get_step(step.id).status == StepStatus.SUCCEEDED  # type: ignore[union-attr]
    assert take_pass(store, run.id, None, never).decision is None
    with pytest.raises(RunNotFoundError):
        take_pass(store, "00000000-0000-0000-0000-000000000000", None, never)


def test_advance_ends_run(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    store.note_swept(run.id, 60_000)
    result = take_pass(
        store,
        run.id,
        None,
        lambda v: Decision(run_status=RunStatus.COMPLETED, output={"t": (1,)}, wake_at=123),
    )
    ended = store.get_run(run.id)
    assert ended == result.run
    assert ended.status == RunStatus.COMPLETED and ended.output == {"t": [1]}
    assert ended.wake_at is None and ended.next_sweep_at is None and ended.sweep_count == 0
    assert result.parent_to_wake is None


def test_advance_child_run_settles_parent_step(store: WorkflowStore) -> None:
    parent, _ = make_run(store)
    kids = [
        NewStep(
            name=f"kid{i}",
            seq=i,
            kind=StepKind.CHILD,
            child=NewRun(workflow="child", input={"i": i}, idempotency_key=f"c{i}"),
        )
        for i in range(3)
    ]
    made = take_pass(store, parent.id, None, lambda v: Decision(new_steps=kids))
    assert made.steps == []  # child steps are not sent to workers
    assert len(made.children_to_wake) == 3
    steps = {s.name: s for s in store.get_steps(parent.id)}
    children = {}
    for i in range(3):
        step = steps[f"kid{i}"]
        assert step.status == StepStatus.RUNNING and step.attempt == 1
        assert step.lease_expires_at is None and step.child_run_id == made.children_to_wake[i]
        child = store.get_run(step.child_run_id)
        assert child is not None and child.input == {"i": i} and child.workflow == "child"
        assert (child.parent_run_id, child.parent_step_id) == (parent.id, step.id)
        assert child.status == RunStatus.RUNNING and child.version == 1
        children[i] = child
    rows = {a.step_id: a for a in store.get_attempts(parent.id)}
    assert rows[steps["kid0"].id].status == AttemptStatus.RUNNING
    assert rows[steps["kid0"].id].worker is None

    before = store.get_run(parent.id)
    ok = take_pass(
        store, children[0].id, None, lambda v: Decision(run_status=RunStatus.COMPLETED, output=[7])
    )
    assert ok.parent_to_wake == parent.id
    assert store.get_run(parent.id).version == before.version + 1  # type: ignore[union-attr]
    kid0 = store.get_step(steps["kid0"].id)
    assert kid0.status == StepStatus.SUCCEEDED and kid0.result == [7]  # type: ignore[union-attr]
    err = {"type": "ValueError", "message": "bad", "traceback": "tb"}
    take_pass(
        store, children[1].id, None, lambda v: Decision(run_status=RunStatus.FAILED, error=err)
    )
    kid1 = store.get_step(steps["kid1"].id)
    assert kid1.status == StepStatus.FAILED and kid1.settled  # type: ignore[union-attr]
    assert kid1.error["type"] == "ValueError" and "bad" in kid1.error["message"]  # type: ignore[index,union-attr]
    assert children[1].id in kid1.error["message"]  # type: ignore[index,union-attr]
    take_pass(store, children[2].id, None, lambda v: Decision(run_status=RunStatus.CANCELLED))
    kid2 = store.get_step(steps["kid2"].id)
    assert kid2.error["type"] == "WorkflowCancelledError"  # type: ignore[index,union-attr]
    rows = {a.step_id: a for a in store.get_attempts(parent.id)}
    assert rows[kid0.id].status == AttemptStatus.SUCCEEDED and rows[kid0.id].result == [7]  # type: ignore[union-attr]
    assert rows[kid1.id].status == AttemptStatus.FAILED and rows[kid1.id].error == kid1.error  # type: ignore[union-attr]


def test_advance_cancels_children(store: WorkflowStore) -> None:
    parent, steps = make_run(
        store,
        NewStep(name="kid", seq=0, kind=StepKind.CHILD, child=NewRun(workflow="c", input=None)),
    )
    child_id = steps["kid"].child_run_id
    assert child_id is not None
    child = store.get_run(child_id)
    result = take_pass(
        store, parent.id, None, lambda v: Decision(cancel_children=[child_id, child_id])
    )
    assert result.children_to_wake == [child_id]
    flagged = store.get_run(child_id)
    assert flagged.cancel_requested and flagged.version == child.version + 1  # type: ignore[union-attr]
    again = take_pass(store, parent.id, None, lambda v: Decision(cancel_children=[child_id]))
    assert again.children_to_wake == []


def test_advance_resolutions_and_redispatch(store: WorkflowStore) -> None:
    run, steps = make_run(
        store,
        NewStep(name="nap", seq=0, kind=StepKind.SLEEP, wake_at=1),
        NewStep(name="sig", seq=1, kind=StepKind.SIGNAL, wake_at=2),
        NewStep(name="val", seq=2, kind=StepKind.VALUE, result=1),
        task("retry", 3, max_attempts=2),
    )
    got = claim(store, steps["retry"], "w")
    store.fail_step(got.id, got.attempt, {"type": "E", "message": "", "traceback": ""}, 60.0)
    decision = Decision(
        resolutions=[
            StepResolution(steps["nap"].id, ok=True, result=None),
            StepResolution(
                steps["sig"].id, ok=False, error={"type": "SignalTimeoutError", "message": "t"}
            ),
            StepResolution(steps["val"].id, ok=True, result="ignored: already settled"),
        ],
        redispatch=[steps["retry"].id],
    )
    views: list[RunView] = []
    result = take_pass(store, run.id, None, seen_by(views, decision))
    now = views[0].now
    after = {s.name: s for s in store.get_steps(run.id)}
    assert after["nap"].status == StepStatus.SUCCEEDED and after["nap"].wake_at is None
    assert after["sig"].status == StepStatus.FAILED and after["sig"].settled
    assert after["sig"].error == {"type": "SignalTimeoutError", "message": "t"}
    assert after["val"].result == 1
    assert [s.name for s in result.steps] == ["retry"]
    assert result.steps[0].scheduled_at == now == after["retry"].scheduled_at
    assert result.steps[0] == after["retry"]


def test_advance_refuses_a_bad_decision_writing_nothing(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    before_run, before_steps = store.get_run(run.id), store.get_steps(run.id)
    outcome = StepOutcome(step.id, got.attempt, ok=True, result="fine")
    bad_decisions = [
        Decision(new_steps=[task("x", 1, args=[object()])]),
        Decision(new_steps=[task("x", 1, kwargs={"when": {1, 2}})]),
        Decision(
            new_steps=[
                task("ok", 1),
                NewStep(name="kid", seq=2, kind=StepKind.CHILD, child=NewRun("c", object())),
            ]
        ),
        Decision(new_steps=[task("ok", 1)], run_status=RunStatus.COMPLETED, output=b"bytes"),
        Decision(new_steps=[NewStep(name="v", seq=1, kind=StepKind.VALUE, result=float("nan"))]),
    ]
    for decision in bad_decisions:
        with pytest.raises(PayloadError):
            take_pass(store, run.id, outcome, lambda v, d=decision: d)  # type: ignore[misc]
    for decision in (
        Decision(new_steps=[task("s0", 5)]),  # the name is taken
        Decision(new_steps=[task("twice", 1), task("twice", 2)]),
    ):
        with pytest.raises(DuplicateStepError):
            take_pass(store, run.id, outcome, lambda v, d=decision: d)  # type: ignore[misc]
    with pytest.raises(StoreError):
        take_pass(store, run.id, outcome, lambda v: Decision(redispatch=["no-such-step"]))

    def broken(view: RunView) -> Decision:
        raise RuntimeError("replay bug")

    with pytest.raises(RuntimeError):
        take_pass(store, run.id, outcome, broken)
    assert store.get_run(run.id) == before_run
    assert store.get_steps(run.id) == before_steps  # the outcome was rolled back too
    assert store.list_runs(workflow="c") == []
    assert attempts_of(store, run.id, step.id)[1].status == AttemptStatus.RUNNING
    take_pass(store, run.id, outcome, lambda v: Decision())
    assert store.get_step(step.id).result == "fine"  # type: ignore[union-attr]


def test_advance_refuses_a_bad_outcome_writing_nothing(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")

    def never(view: RunView) -> Decision:
        raise AssertionError("not reached")

    with pytest.raises(PayloadError, match="s0"):
        take_pass(store, run.id, StepOutcome(step.id, got.attempt, ok=True, result=object()), never)
    with pytest.raises(PayloadError):
        take_pass(
            store,
            run.id,
            StepOutcome(step.id, got.attempt, ok=False, error={"type": 1j}),
            never,
        )
    assert store.get_step(step.id) == got
    assert attempts_of(store, run.id, step.id)[1].result is None


def test_passes_of_one_run_are_serialised(store: WorkflowStore) -> None:
    """Racing passes each apply a decision made on the run as the pass before
    left it: a decision made on an older view is never applied (it decides
    again). ``decide`` runs outside the store's lock (it is user code), so
    decisions may overlap in time; what lands never does."""
    run, _ = make_run(store)
    lock = threading.Lock()
    decided: list[int] = []

    def decide(view: RunView) -> Decision:
        threading.Event().wait(0.05)  # widen the window a second pass would need
        n = len(view.steps)  # each applied pass must see the steps of the one before
        with lock:
            decided.append(n)
        return Decision(new_steps=[task(f"s{n}", n)])

    results = race(*[lambda: take_pass(store, run.id, None, decide)] * 3)
    assert all(kind == "ok" for kind, _ in results), results
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "s1", "s2"]
    assert store.get_run(run.id).version == run.version + 3  # type: ignore[union-attr]
    assert sorted(set(decided)) == [0, 1, 2]


def test_a_slow_decide_holds_no_lock_on_the_run(store: WorkflowStore) -> None:
    """A body that takes its time never blocks a cancel (or a signal) of its run."""
    run, _ = make_run(store)
    inside, release = threading.Event(), threading.Event()

    def slow(view: RunView) -> Decision:
        inside.set()
        assert release.wait(10)
        return Decision(new_steps=[task("late", 1)])

    passing = threading.Thread(target=lambda: take_pass(store, run.id, None, slow))
    passing.start()
    try:
        assert inside.wait(10)
        done = threading.Event()
        threading.Thread(target=lambda: (store.request_cancel(run.id), done.set())).start()
        assert done.wait(5), "cancel waited for a running decide"
    finally:
        release.set()
        passing.join(10)
    again: list[RunView] = []
    take_pass(store, run.id, None, seen_by(again))
    assert again[-1].run.cancel_requested  # the slow pass lost its race and decided again


# --- payloads are refused before anything is written ---------------------------


def test_json_refusal_writes_nothing(store: WorkflowStore) -> None:
    with pytest.raises(PayloadError, match=r"input\['when'\]"):
        store.create_run(NewRun("wf", {"when": object()}, idempotency_key="k"))
    assert store.list_runs() == []
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    with pytest.raises(PayloadError):
        store.complete_step(step.id, got.attempt, {"x": {1, 2}})
    with pytest.raises(PayloadError):
        store.fail_step(step.id, got.attempt, {"type": object()})
    with pytest.raises(PayloadError):
        store.complete_step(step.id, got.attempt, float("inf"))
    assert store.get_step(step.id) == got
    [row] = store.get_attempts(run.id)
    assert row.status == AttemptStatus.RUNNING and row.result is None and row.error is None
    store.complete_step(step.id, got.attempt, {"x": [1, 2]})
    assert store.get_step(step.id).result == {"x": [1, 2]}  # type: ignore[union-attr]


# --- sweep queries -----------------------------------------------------------------


def test_lapsed_steps_oldest_first_limited(store: WorkflowStore) -> None:
    _, steps = make_tasks(store, 5, max_attempts=3)
    claimed = [
        claim(store, s, f"w{i}", lease=lease)
        for i, (s, lease) in enumerate(zip(steps[:3], (250, 50, 150), strict=True))
    ]
    claim(store, steps[3], "live", lease=LONG)
    parked = claim(store, steps[4], "parked", lease=50)
    store.refresh_step_lease(parked.id, parked.attempt, None)
    lapse(store, *claimed)
    found = store.lapsed_steps(100)
    assert {s.id for s in found} == {s.id for s in claimed}
    assert [s.lease_expires_at for s in found] == sorted(s.lease_expires_at for s in claimed)  # type: ignore[type-var]
    assert store.lapsed_steps(1) == found[:1]
    assert store.lapsed_steps(2) == found[:2]


def test_undispatched_steps(store: WorkflowStore) -> None:
    _, steps = make_run(
        store,
        task("old", 0),
        task("never_sent", 1, status=StepStatus.PENDING),
        NewStep(name="nap", seq=2, kind=StepKind.SLEEP, wake_at=store.now_ms() + LONG),
        task("running", 3),
    )
    claim(store, steps["running"], "w")
    wait_until(lambda: store.now_ms() > steps["old"].created_at)
    _, steps2 = make_run(store, task("newer", 0))
    wait_until(lambda: store.now_ms() > steps2["newer"].created_at)
    found = store.undispatched_steps(0, 100)
    assert [s.name for s in found][:2] in (["old", "never_sent"], ["never_sent", "old"])
    assert [s.name for s in found][2:] == ["newer"]
    assert len(store.undispatched_steps(0, 2)) == 2
    assert store.undispatched_steps(3_600_000, 100) == []
    store.mark_scheduled([steps["old"].id, steps["never_sent"].id])
    wait_until(lambda: store.now_ms() > store.get_step(steps["old"].id).scheduled_at)  # type: ignore[operator,union-attr]
    assert store.undispatched_steps(0, 100)[0].name == "newer"


def test_due_steps(store: WorkflowStore) -> None:
    now = store.now_ms()
    _, steps = make_run(
        store,
        NewStep(name="late", seq=0, kind=StepKind.SLEEP, wake_at=now - 2_000),
        NewStep(name="later", seq=1, kind=StepKind.SLEEP, wake_at=now - 1_000),
        NewStep(name="future", seq=2, kind=StepKind.SLEEP, wake_at=now + LONG),
        task("retry", 3, max_attempts=2),
        task("final", 4),
    )
    got = claim(store, steps["retry"], "w")
    err = {"type": "E", "message": "", "traceback": ""}
    store.fail_step(got.id, got.attempt, err, retry_delay=0.0)
    fin = claim(store, steps["final"], "w")
    store.fail_step(fin.id, fin.attempt, err)
    retry = store.get_step(got.id)
    wait_until(lambda: store.now_ms() >= retry.wake_at)  # type: ignore[operator,union-attr]
    found = store.due_steps(100)
    assert [s.name for s in found] == ["late", "later", "retry"]
    assert [s.name for s in store.due_steps(2)] == ["late", "later"]


def test_idle_runs(store: WorkflowStore) -> None:
    quiet, _ = make_run(store, NewStep(name="v", seq=0, kind=StepKind.VALUE, result=1))
    wait_until(lambda: store.now_ms() > quiet.updated_at)
    empty, _ = make_run(store)
    make_run(store, task("t", 0))  # busy: a step in flight
    ended, _ = make_run(store)
    record(store, ended.id, run_status=RunStatus.COMPLETED)
    _, rsteps = make_run(store, task("t", 0, max_attempts=2))  # waits for a retry
    got = claim(store, rsteps["t"], "w")
    store.fail_step(got.id, 1, {"type": "E", "message": "", "traceback": ""}, retry_delay=60.0)
    latest = max(r.updated_at for r in store.list_runs())
    wait_until(lambda: store.now_ms() > latest)
    found = store.idle_runs(0, 100)
    assert [r.id for r in found] == [quiet.id, empty.id]
    assert [r.id for r in store.idle_runs(0, 1)] == [quiet.id]
    assert store.idle_runs(3_600_000, 100) == []


def test_note_swept_is_overlap_safe(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    assert store.note_swept(run.id, LONG) is True
    assert store.note_swept(run.id, LONG) is False  # a wake-up is already pending
    noted = store.get_run(run.id)
    assert noted.sweep_count == 1 and noted.next_sweep_at is not None  # type: ignore[union-attr]
    assert noted.version == run.version  # type: ignore[union-attr]
    other, _ = make_run(store)
    results = race(*[lambda: store.note_swept(other.id, LONG)] * 8)
    assert sorted(value for _, value in results) == [False] * 7 + [True]
    short, _ = make_run(store)
    assert store.note_swept(short.id, 50) is True
    first = store.get_run(short.id)
    wait_until(lambda: store.now_ms() >= first.next_sweep_at)  # type: ignore[operator,union-attr]
    assert store.note_swept(short.id, 50) is True
    assert store.get_run(short.id).sweep_count == 2  # type: ignore[union-attr]
    after = take_pass(store, short.id, None, lambda v: Decision())
    assert after.run.next_sweep_at is None and after.run.sweep_count == 0
    assert store.get_run(short.id) == after.run
    record(store, run.id, run_status=RunStatus.COMPLETED)
    assert store.note_swept(run.id, 0) is False
    assert store.note_swept("00000000-0000-0000-0000-000000000000", 10) is False


def test_waiting_by_queue_counts_unclaimed_steps_per_queue(store: WorkflowStore) -> None:
    _, [a, b, c] = make_tasks(store, 3)
    make_run(store, task("x", 0, queue="ovens"))
    claim(store, a, "w")  # a claimed step is not waiting
    found = store.waiting_by_queue(0)
    by_queue = {queue: (steps, oldest) for queue, steps, oldest in found}
    assert by_queue[None][0] == 2 and by_queue["ovens"][0] == 1
    assert found[0][0] is None  # busiest first
    assert all(oldest >= 0 for _, oldest in by_queue.values())
    assert store.waiting_by_queue(3_600_000) == []  # none waited an hour
    claim(store, b, "w")
    claim(store, c, "w")
    assert {q for q, _, _ in store.waiting_by_queue(0)} == {"ovens"}


def test_the_memory_store_writes_an_outcome_on_the_pass_clock_its_view_shows() -> None:
    """The view a pass decides on and the row it writes agree, even when the
    clock moves between them (here: a millisecond on every read)."""
    ticks = iter(range(1_000_000, 2_000_000))
    store = InMemoryWorkflowStore(clock=lambda: next(ticks))
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    views: list[RunView] = []
    take_pass(store, run.id, StepOutcome(step.id, got.attempt, ok=True, result=1), seen_by(views))
    assert views[-1].steps[0] == store.get_step(step.id)
    nxt = store.get_step(step.id)
    assert nxt is not None and nxt.updated_at == views[-1].now


def test_steps_and_attempts_are_counted_by_status(store: WorkflowStore) -> None:
    assert store.count_steps_by_status() == dict.fromkeys(StepStatus, 0)
    assert store.count_attempts_by_status() == dict.fromkeys(AttemptStatus, 0)
    run, steps = make_tasks(store, 3, max_attempts=2)
    done, failing, _pending = steps
    got = claim(store, done, "w")
    store.complete_step(done.id, got.attempt, "ok", got.claim_id)
    lost = claim(store, failing, "w", lease=SHORT)
    lapse(store, lost)
    again = claim(store, failing, "w2")  # takes the lapsed attempt over
    store.fail_step(failing.id, again.attempt, {"type": "E", "message": "no"}, None, again.claim_id)
    steps_by = store.count_steps_by_status()
    assert (steps_by[StepStatus.SUCCEEDED], steps_by[StepStatus.FAILED]) == (1, 1)
    assert steps_by[StepStatus.RUNNING] == 0 and sum(steps_by.values()) == 3
    attempts_by = store.count_attempts_by_status()
    assert attempts_by[AttemptStatus.SUCCEEDED] == 1
    assert attempts_by[AttemptStatus.SUPERSEDED] == 1
    assert attempts_by[AttemptStatus.FAILED] == 1
    assert sum(attempts_by.values()) == len(store.get_attempts(run.id)) == 3


def test_in_flight_views_page_through_unsettled_runs_with_their_steps_and_signals(
    store: WorkflowStore,
) -> None:
    live = [make_run(store, task("a", 0), task("b", 1), workflow_version="1")[0] for _ in range(5)]
    ended, _ = make_run(store, task("a", 0))
    record(store, ended.id, run_status=RunStatus.COMPLETED, output=1)
    store.send_signal(live[2].id, "go", {"n": 2})
    seen: list[RunView] = []
    after: str | None = None
    while True:
        page = store.in_flight_views(after, 2)
        seen += page
        if len(page) < 2:
            break
        after = page[-1].run.id
    assert [v.run.id for v in seen] == sorted(r.id for r in live)  # by id, the settled left out
    for view in seen:
        assert view.run == store.get_run(view.run.id)
        assert view.steps == store.get_steps(view.run.id)
        assert [s.name for s in view.steps] == ["a", "b"]
        assert view.signals == ({"go": {"n": 2}} if view.run.id == live[2].id else {})
        assert view.run.workflow_version == "1"
    assert store.in_flight_views(max(r.id for r in live), 10) == []
