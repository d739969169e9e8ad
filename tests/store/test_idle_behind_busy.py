"""The idle sweep finds an idle run behind any number of busy ones, on every store.

A year's live runs are mostly busy (a step in flight) and quiet for long
(a long sleep, a long step): the idle sweep must not re-read them all on
every sweep, yet must still find the one run whose last step settled with
no pass after it. A busy run it looked at is set aside for the idle period;
one that goes idle meanwhile is found once that period is over.
"""

from __future__ import annotations

from pikku_celery.store import NewStep, StepKind, WorkflowStore
from tests.helpers import wait_until
from tests.store.support import claim, make_run, task

BUSY = 12


def _quiet(store: WorkflowStore) -> str:
    run, _ = make_run(store, NewStep(name="v", seq=0, kind=StepKind.VALUE, result=1))
    return run.id


def test_an_idle_run_behind_many_busy_ones_is_found(store: WorkflowStore) -> None:
    busy = [make_run(store, task("t", 0))[0].id for _ in range(BUSY)]  # older: read first
    idle = _quiet(store)
    newest = store.get_run(idle)
    assert newest is not None
    wait_until(lambda: store.now_ms() > newest.updated_at)
    # windows of 2: the busy ones fill the first six, and are set aside as read
    assert [r.id for r in store.idle_runs(0, 2)] == [idle]
    assert idle not in busy


def test_a_busy_run_set_aside_is_found_once_it_goes_idle(store: WorkflowStore) -> None:
    idle_ms = 300
    run, steps = make_run(store, task("t", 0))
    wait_until(lambda: store.now_ms() > run.updated_at + idle_ms)
    assert store.idle_runs(idle_ms, 10) == []  # busy: a step in flight; set aside
    got = claim(store, steps["t"], "w")
    store.complete_step(got.id, got.attempt, "done", got.claim_id)  # settled, no pass after
    wait_until(lambda: [r.id for r in store.idle_runs(idle_ms, 10)] == [run.id], timeout=10)
