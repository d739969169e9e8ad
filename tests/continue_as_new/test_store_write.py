"""A continuing pass writes the successor and both links in its own write, once."""

from __future__ import annotations

from pikku_celery.engine.continuing import KEY_PREFIX, successor_id
from pikku_celery.model.plan import Moved, plan_pass
from pikku_celery.model.values import Decision, NewRun, RunStatus
from pikku_celery.store import WorkflowStore
from tests.store.support import make_run


def continuing(run_id: str, input: object) -> Decision:
    successor = NewRun(
        workflow="wf",
        input=input,
        id=successor_id(run_id),
        idempotency_key=KEY_PREFIX + run_id,
        continued_from=run_id,
    )
    return Decision(run_status=RunStatus.COMPLETED, successor=successor)


def test_the_pass_that_ends_a_run_starts_its_successor_linked_both_ways(
    store: WorkflowStore,
) -> None:
    run, _ = make_run(store)
    read = store.read_pass(run.id)
    done = store.write_pass(read, plan_pass(read.view, None, continuing(run.id, {"page": 2})))

    assert not isinstance(done, Moved)
    after = store.get_run(run.id)
    assert after is not None
    assert after.status == RunStatus.COMPLETED and after.output is None
    assert after.continued_as == successor_id(run.id)
    successor = store.get_run(successor_id(run.id))
    assert successor is not None
    assert successor.status == RunStatus.RUNNING
    assert successor.input == {"page": 2}
    assert successor.continued_from == run.id
    assert successor.idempotency_key == KEY_PREFIX + run.id
    assert successor.id in done.children_to_wake  # its first pass is asked for


def test_a_repeated_pass_on_the_same_view_starts_no_second_successor(
    store: WorkflowStore,
) -> None:
    run, _ = make_run(store)
    read = store.read_pass(run.id)
    plan = plan_pass(read.view, None, continuing(run.id, 1))
    assert not isinstance(store.write_pass(read, plan), Moved)

    again = store.write_pass(read, plan)  # a redelivered message's pass, on its old view

    assert isinstance(again, Moved)
    runs = store.list_runs(workflow="wf")
    assert sorted(r.id for r in runs) == sorted([run.id, successor_id(run.id)])


def test_a_pass_that_ends_otherwise_starts_nothing(store: WorkflowStore) -> None:
    run, _ = make_run(store)
    read = store.read_pass(run.id)
    failing = Decision(run_status=RunStatus.FAILED, error={"type": "E", "message": "no"})
    store.write_pass(read, plan_pass(read.view, None, failing))

    after = store.get_run(run.id)
    assert after is not None and after.continued_as is None
    assert store.get_run(successor_id(run.id)) is None
