"""Prune racing workers, on every store: real threads, each on its own connection.

Workers finish runs (settle them), keep runs running, park roots on settled
children, and fail runs then retry them, while a pruner prunes everything
settled up to the store's 'now' again and again. Whatever interleaving the
database picks, nothing running or referenced is deleted, no tree is half
deleted, no worker's write fails, and the pruned counts are exact.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import sqlalchemy as sa

from pikku_celery.engine.passes import take_pass
from pikku_celery.engine.prune import PruneReport, prune_runs
from pikku_celery.errors import RunNotFoundError
from pikku_celery.sql.schema import run_table
from pikku_celery.store import Decision, NewRun, NewStep, RunStatus, StepKind, WorkflowStore
from pikku_celery.store.prune import PruneQuery, RunPruning
from pikku_celery.store.sql_for import store_for
from tests.helpers import LONG
from tests.store.support import claim, make_run, task

WORKERS = 6 if LONG else 3
ROUNDS = 100 if LONG else 8  # each round: one run of each kind, per worker (PIKKU_LONG=1: more)


@dataclass
class Made:
    """What the workers did, by what must become of it."""

    finished: list[str] = field(default_factory=list)  # settled: pruned in the end
    running: list[str] = field(default_factory=list)  # still running: kept
    parents: list[tuple[str, str]] = field(default_factory=list)  # running root, settled child
    retried: list[str] = field(default_factory=list)  # reopened before a prune took it
    lost_retry: list[str] = field(default_factory=list)  # pruned before its retry
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, item: object) -> None:
        with self.lock:
            getattr(self, kind).append(item)


def settle(store: WorkflowStore, run_id: str, status: RunStatus) -> None:
    error = None if status == RunStatus.COMPLETED else {"type": "Boom", "message": "no"}
    take_pass(store, run_id, None, lambda view: Decision(run_status=status, output=1, error=error))


def one_round(store: WorkflowStore, worker: str, made: Made) -> None:
    # finished: a step done, the run settled
    run, steps = make_run(store, task("a"))
    step = claim(store, steps["a"], worker)
    store.complete_step(step.id, step.attempt, 1, step.claim_id)
    settle(store, run.id, RunStatus.COMPLETED)
    made.add("finished", run.id)
    # running: its step claimed, never finished
    run, steps = make_run(store, task("a"))
    claim(store, steps["a"], worker)
    made.add("running", run.id)
    # a running root parked on a child that settled
    kid = NewRun(workflow="child", input=1)
    root, _ = make_run(store, NewStep(name="kid", seq=0, kind=StepKind.CHILD, child=kid))
    settle(store, kid.id, RunStatus.COMPLETED)
    made.add("parents", (root.id, kid.id))
    # failed, then retried while the pruner may be taking it
    run, steps = make_run(store, task("a"))
    step = claim(store, steps["a"], worker)
    store.fail_step(step.id, step.attempt, {"type": "Boom", "message": "no"}, None, step.claim_id)
    settle(store, run.id, RunStatus.FAILED)
    try:
        store.retry_run(run.id)
        made.add("retried", run.id)
    except RunNotFoundError:
        made.add("lost_retry", run.id)


def test_prune_never_takes_what_is_running_or_referenced(store: WorkflowStore) -> None:
    assert isinstance(store, RunPruning)
    pruner: RunPruning = store
    made = Made()
    done = threading.Event()
    total = PruneReport()

    def prune_once() -> None:
        query = PruneQuery(cutoff_ms=store.now_ms(), batch_size=3)
        report = prune_runs(pruner, query)
        total.counts.add(report.counts)
        total.trees += report.trees

    def work(worker: str) -> None:
        try:
            for _ in range(ROUNDS):
                one_round(store, worker, made)
        except BaseException as exc:  # every write must stand
            made.errors.append(exc)

    def prune_loop() -> None:
        try:
            while not done.is_set():
                prune_once()
        except BaseException as exc:
            made.errors.append(exc)

    workers = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(WORKERS)]
    pruning = threading.Thread(target=prune_loop)
    pruning.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    done.set()
    pruning.join(120)
    assert not made.errors, made.errors
    prune_once()  # whatever settled since the last pass

    rounds = WORKERS * ROUNDS
    assert len(made.retried) + len(made.lost_retry) == rounds
    gone = made.finished + made.lost_retry
    # exact: one run, one step, one attempt per pruned run; nothing else went
    assert (total.counts.runs, total.counts.steps, total.counts.attempts) == (len(gone),) * 3
    assert total.trees == len(gone)
    for run_id in gone:
        assert store.get_run(run_id) is None and store.get_steps(run_id) == []
    for run_id in made.running + made.retried:
        run = store.get_run(run_id)
        assert run is not None and not run.status.terminal
        assert len(store.get_steps(run_id)) == 1
        assert [a.attempt for a in store.get_attempts(run_id)] == [1]
    for root, kid in made.parents:
        assert store.get_run(root) is not None and len(store.get_steps(root)) == 1
        child = store.get_run(kid)
        assert child is not None and child.status == RunStatus.COMPLETED


def test_a_run_another_transaction_holds_is_skipped_not_waited_for(
    server_engine: sa.Engine,
) -> None:
    """PostgreSQL and MariaDB: a run row locked by a worker's transaction (a
    retry, a pass) is passed over at once; the rest of the batch goes."""
    store = store_for(server_engine)
    held, free = [make_run(store, task("a"))[0].id for _ in range(2)]
    for run_id in (held, free):
        settle(store, run_id, RunStatus.COMPLETED)
    cutoff = store.now_ms()
    with server_engine.connect() as worker, worker.begin():
        worker.execute(run_table.select().where(run_table.c.id == held).with_for_update())
        reports: list[PruneReport] = []
        pruning = threading.Thread(
            target=lambda: reports.append(prune_runs(store, PruneQuery(cutoff_ms=cutoff)))
        )
        pruning.start()
        pruning.join(30)
        assert not pruning.is_alive(), "the prune waited for the worker's lock"
    [report] = reports
    assert report.counts.runs == 1 and report.looked_at == 2
    assert store.get_run(free) is None and store.get_run(held) is not None
    later = prune_runs(store, PruneQuery(cutoff_ms=cutoff))  # the lock is gone: it goes now
    assert later.counts.runs == 1 and store.get_run(held) is None
