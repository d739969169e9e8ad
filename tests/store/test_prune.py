"""Pruning conformance: every store deletes whole settled run trees, nothing else.

Parametrised over memory, SQLite, PostgreSQL and MariaDB (see conftest.py).
A prune's cutoff is the store's own clock, read after the runs it should
take settled; runs settled after it are too young.
"""

from __future__ import annotations

from typing import Any

import pytest

from pikku_celery.engine.passes import take_pass
from pikku_celery.engine.prune import prune_runs
from pikku_celery.lease.sql import SQLLeaseService
from pikku_celery.store import (
    Decision,
    NewRun,
    NewStep,
    Operator,
    RunStatus,
    StepKind,
    WorkflowStore,
)
from pikku_celery.store.prune import RUN_LEASE_PREFIX, PruneQuery, RunPruning
from pikku_celery.store.sql import SQLWorkflowStore
from tests.helpers import wait_until
from tests.store.support import claim, make_run, task

OPERATOR = Operator(actor="ops@example.com", origin="test")


def settle(store: WorkflowStore, run_id: str, status: RunStatus = RunStatus.COMPLETED) -> None:
    """End the run with ``status`` (a pass that decides so)."""
    error = None if status == RunStatus.COMPLETED else {"type": "Boom", "message": "no"}
    take_pass(store, run_id, None, lambda view: Decision(run_status=status, output=1, error=error))


def finished_run(store: WorkflowStore, workflow: str = "wf", **new: Any) -> str:
    """A run with one step done (an attempt row), a signal and an audit row, settled."""
    run, steps = make_run(store, task("a"), workflow=workflow, **new)
    step = claim(store, steps["a"], "w")
    store.complete_step(step.id, step.attempt, {"ok": True}, step.claim_id)
    store.send_signal(run.id, "go", {"n": 1})
    store.record_action(run.id, "signal", OPERATOR, {"name": "go"})
    settle(store, run.id)
    return run.id


def with_child(store: WorkflowStore, settle_child: bool = True) -> tuple[str, str]:
    """A root whose step is parked on a child run (with a step of its own)."""
    kid = NewRun(workflow="child", input=1)
    root, _ = make_run(store, NewStep(name="kid", seq=0, kind=StepKind.CHILD, child=kid))
    take_pass(store, kid.id, None, lambda view: Decision(new_steps=[task("c")]))
    if settle_child:
        settle(store, kid.id)
    return root.id, kid.id


def cutoff_after(store: WorkflowStore) -> int:
    """The store's now, once it is past every time written so far."""
    now = store.now_ms()
    wait_until(lambda: store.now_ms() > now)
    return now


def pruning(store: WorkflowStore) -> RunPruning:
    assert isinstance(store, RunPruning)
    return store


def test_every_store_prunes(store: WorkflowStore) -> None:
    assert isinstance(store, RunPruning)


def test_a_settled_tree_goes_whole_with_everything_it_owns(store: WorkflowStore) -> None:
    done = finished_run(store)
    root, kid = with_child(store)
    settle(store, root)
    live, _ = make_run(store, task("x"))  # running: stays
    leases = None
    if isinstance(store, SQLWorkflowStore):  # a run lease in the store's own database
        leases = SQLLeaseService(store.engine)
        leases.acquire(RUN_LEASE_PREFIX + done, "w", 60)
    cutoff = cutoff_after(store)
    young = finished_run(store)  # settled after the cutoff: stays

    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff, batch_size=1))

    counts = report.counts
    assert (counts.runs, counts.steps, counts.attempts) == (3, 3, 2)  # a child step has one
    assert (counts.signals, counts.audit, counts.leases) == (1, 1, 1 if leases else 0)
    assert report.trees == 2 and report.finished
    for gone in (done, root, kid):
        assert store.get_run(gone) is None
        assert store.get_steps(gone) == [] and store.get_attempts(gone) == []
        assert store.get_signals(gone) == {} and store.audit_trail(gone) == []
    if leases is not None:
        assert leases.get(RUN_LEASE_PREFIX + done) is None
    for kept in (live.id, young):
        assert store.get_run(kept) is not None and len(store.get_steps(kept)) == 1
    assert len(store.get_attempts(young)) == 1 and store.audit_trail(young)


def test_a_tree_with_a_run_still_going_is_left_whole(store: WorkflowStore) -> None:
    root, kid = with_child(store, settle_child=False)
    settle(store, root, RunStatus.FAILED)  # the root ended, its child has not
    cutoff = cutoff_after(store)
    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff))
    assert report.counts.runs == 0 and report.looked_at == 1 and report.finished
    assert store.get_run(root) is not None and store.get_run(kid) is not None
    assert len(store.get_steps(kid)) == 1

    settle(store, kid, RunStatus.CANCELLED)
    cutoff = cutoff_after(store)
    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff))
    assert (report.counts.runs, report.counts.steps) == (2, 2)
    assert store.get_run(root) is None and store.get_run(kid) is None


def test_a_child_settled_after_the_cutoff_keeps_its_tree(store: WorkflowStore) -> None:
    root, kid = with_child(store, settle_child=False)
    settle(store, root, RunStatus.FAILED)
    cutoff = cutoff_after(store)
    settle(store, kid)
    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff))
    assert report.counts.runs == 0
    assert store.get_run(root) is not None and store.get_run(kid) is not None


def test_a_dry_run_deletes_nothing_and_counts_what_a_prune_takes(store: WorkflowStore) -> None:
    ids = [finished_run(store) for _ in range(3)]
    root, _ = with_child(store)
    settle(store, root)
    cutoff = cutoff_after(store)
    query = PruneQuery(cutoff_ms=cutoff, batch_size=2)
    dry = prune_runs(pruning(store), query, dry_run=True)
    for run_id in ids:
        assert store.get_run(run_id) is not None and store.get_attempts(run_id)
    assert pruning(store).count_prunable(query) == 4
    real = prune_runs(pruning(store), query)
    assert dry.counts == real.counts and dry.trees == real.trees == 4
    assert (real.counts.runs, real.counts.steps, real.counts.attempts) == (5, 5, 4)
    assert pruning(store).count_prunable(query) == 0


def test_filters_take_only_their_roots(store: WorkflowStore) -> None:
    a = finished_run(store, workflow="a")
    b = finished_run(store, workflow="b")
    run, _ = make_run(store, task("s"), workflow="a")
    settle(store, run.id, RunStatus.FAILED)
    cutoff = cutoff_after(store)
    by_status = PruneQuery(cutoff_ms=cutoff, workflow="a", status=RunStatus.FAILED)
    assert pruning(store).count_prunable(by_status) == 1
    assert prune_runs(pruning(store), by_status).counts.runs == 1
    assert store.get_run(run.id) is None and store.get_run(a) is not None
    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff, workflow="b"))
    assert report.counts.runs == 1
    assert store.get_run(b) is None and store.get_run(a) is not None


def test_a_running_status_is_refused() -> None:
    with pytest.raises(ValueError, match="settled"):
        PruneQuery(cutoff_ms=0, status=RunStatus.RUNNING)
    with pytest.raises(ValueError, match="batch_size"):
        PruneQuery(cutoff_ms=0, batch_size=0)


def test_batches_walk_past_trees_they_leave(store: WorkflowStore) -> None:
    blocked = []
    for _ in range(3):
        root, _ = with_child(store, settle_child=False)
        settle(store, root, RunStatus.FAILED)
        blocked.append(root)
    done = [finished_run(store) for _ in range(2)]
    cutoff = cutoff_after(store)
    seen: list[int] = []
    report = prune_runs(
        pruning(store),
        PruneQuery(cutoff_ms=cutoff, batch_size=1),
        on_batch=lambda batch: seen.append(batch.trees),
    )
    assert report.finished and report.batches == 5 and sorted(seen) == [0, 0, 0, 1, 1]
    assert report.counts.runs == 2 and all(store.get_run(r) is None for r in done)
    assert all(store.get_run(r) is not None for r in blocked)


def test_a_pruned_idempotency_key_starts_a_new_run(store: WorkflowStore) -> None:
    first = finished_run(store, idempotency_key="order-7")
    cutoff = cutoff_after(store)
    prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff))
    again, created = store.create_run(NewRun(workflow="wf", input=1, idempotency_key="order-7"))
    assert created and again.id != first


def test_a_time_budget_stops_between_batches(store: WorkflowStore) -> None:
    for _ in range(3):
        finished_run(store)
    cutoff = cutoff_after(store)
    report = prune_runs(pruning(store), PruneQuery(cutoff_ms=cutoff, batch_size=1), time_budget=0)
    assert report.batches == 1 and not report.finished and report.counts.runs == 1
