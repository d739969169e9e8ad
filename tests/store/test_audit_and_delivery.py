"""Every store keeps what a person needs to follow a run: the Celery message
and node of each attempt, the operators' actions, and each live run's steps
for the runs list. The claim writes the delivery in its own write; the audit
trail is append-only and survives a retry."""

from __future__ import annotations

import pytest

from pikku_celery.engine.passes import take_pass
from pikku_celery.model.values import EAGER, EagerClaim
from pikku_celery.store import (
    AttemptStatus,
    AuditAction,
    Decision,
    Delivery,
    NewStep,
    Operator,
    RunStatus,
    StepKind,
    StepOutcome,
    StepStatus,
    WorkflowStore,
)
from tests.store.support import LONG, SHORT, TASK, claim, lapse, make_run, make_tasks, record, task

FIRST = Delivery("6f1c1b8e-0c1e-4d4e-9d36-0f0d7f1a0001", "celery@alpha")
SECOND = Delivery("6f1c1b8e-0c1e-4d4e-9d36-0f0d7f1a0002", "celery@beta")


def test_a_claim_writes_its_message_and_node_on_its_attempt_row(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=3)
    first = store.claim_step(step.id, TASK, "alpha:11", SHORT, delivery=FIRST)
    assert first is not None
    lapse(store, first)
    second = store.claim_step(step.id, TASK, "beta:22", LONG, delivery=SECOND)
    assert second is not None and second.attempt == 2
    rows = {a.attempt: a for a in store.get_attempts(run.id)}
    assert (rows[1].task_id, rows[1].node, rows[1].worker) == (
        FIRST.task_id,
        "celery@alpha",
        "alpha:11",
    )
    assert rows[1].status == AttemptStatus.SUPERSEDED  # the takeover keeps the first's names
    assert (rows[2].task_id, rows[2].node, rows[2].worker) == (
        SECOND.task_id,
        "celery@beta",
        "beta:22",
    )


def test_a_claim_without_a_delivery_leaves_both_empty(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1)
    claim(store, step, "w")
    [row] = store.get_attempts(run.id)
    assert (row.task_id, row.node) == (None, None)


def test_an_eager_attempt_names_the_message_that_carried_it(store: WorkflowStore) -> None:
    run, [first] = make_tasks(store, 1)
    running = store.claim_step(first.id, TASK, "alpha:11", LONG, delivery=FIRST)
    assert running is not None
    result = take_pass(
        store,
        run.id,
        StepOutcome(first.id, running.attempt, ok=True, claim_id=running.claim_id),
        lambda view: Decision(
            new_steps=[task("next", 1)],
            eager=EagerClaim("next", "alpha:11", LONG, "e" * 32, FIRST),
        ),
    )
    assert result.eager is not None
    [row] = [a for a in store.get_attempts(run.id) if a.step_id == result.eager.id]
    assert row.dispatch == EAGER and row.status == AttemptStatus.RUNNING
    assert (row.task_id, row.node) == (FIRST.task_id, FIRST.node)


def test_actions_are_kept_in_order_on_the_store_clock(store: WorkflowStore) -> None:
    run, _ = make_run(store, task("a"))
    other, _ = make_run(store, task("a"))
    before = store.now_ms()
    cancel = store.record_action(
        run.id, AuditAction.CANCEL, Operator("alice", "10.0.0.7"), {"reason": "stuck"}
    )
    signal = store.record_action(
        run.id, AuditAction.SIGNAL, Operator("bob@host"), {"name": "go", "payload": [1, "x"]}
    )
    store.record_action(other.id, AuditAction.RETRY, Operator("api"))
    after = store.now_ms()
    trail = store.audit_trail(run.id)
    assert trail == [cancel, signal]
    assert [(e.action, e.actor, e.origin) for e in trail] == [
        (AuditAction.CANCEL, "alice", "10.0.0.7"),
        (AuditAction.SIGNAL, "bob@host", None),
    ]
    assert trail[0].details == {"reason": "stuck"}
    assert trail[1].details == {"name": "go", "payload": [1, "x"]}
    assert before <= trail[0].at <= trail[1].at <= after
    assert trail[0].id < trail[1].id
    [retried] = store.audit_trail(other.id)
    assert retried.details == {} and retried.run_id == other.id
    assert store.audit_trail("00000000-0000-0000-0000-000000000000") == []


def test_a_retry_keeps_the_failed_attempts_and_the_trail(store: WorkflowStore) -> None:
    run, [step] = make_tasks(store, 1, max_attempts=1)
    got = claim(store, step, "w")
    error = {"type": "ValueError", "message": "card declined", "traceback": "tb"}
    store.fail_step(step.id, got.attempt, error)
    record(store, run.id, run_status=RunStatus.FAILED, error=error)
    store.record_action(run.id, AuditAction.RETRY, Operator("alice"), {"previous_error": error})
    reopened = store.retry_run(run.id)
    assert reopened.error is None  # the run's own error is cleared for the new attempts...
    again = claim(store, step, "w2")
    [entry] = store.audit_trail(run.id)  # ...and kept where the retry was recorded
    assert entry.details == {"previous_error": error}
    rows = {a.attempt: a for a in store.get_attempts(run.id)}
    assert rows[1].status == AttemptStatus.FAILED and rows[1].error == error
    assert rows[again.attempt].status == AttemptStatus.RUNNING


def test_steps_of_runs_reads_several_runs_at_once(store: WorkflowStore) -> None:
    one, _ = make_run(store, task("a", 0), task("b", 1))
    two, _ = make_run(
        store,
        task("c", 0),
        NewStep(name="wait", seq=1, kind=StepKind.SIGNAL),
    )
    empty, _ = make_run(store)
    found = store.steps_of_runs([one.id, two.id, empty.id])
    assert [s.name for s in found[one.id]] == ["a", "b"]
    assert [(s.name, s.kind) for s in found[two.id]] == [
        ("c", StepKind.TASK),
        ("wait", StepKind.SIGNAL),
    ]
    assert empty.id not in found
    assert store.steps_of_runs([]) == {}
    assert all(s.status == StepStatus.SCHEDULED for s in found[one.id])


@pytest.mark.parametrize("details", [None, {}])
def test_an_action_without_details_reads_back_empty(
    store: WorkflowStore, details: dict | None
) -> None:
    run, _ = make_run(store, task("a"))
    entry = store.record_action(run.id, AuditAction.CANCEL, Operator("api"), details)
    assert entry.details == {} and store.audit_trail(run.id) == [entry]
