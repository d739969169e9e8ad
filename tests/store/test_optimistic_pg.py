"""PostgreSQL's optimistic pass: one read, one version-checked statement.

Between the read and the write another pass, a signal or a new claim may
land; the write must then change nothing and the pass fall back to the
locked one (or refuse a superseded outcome). The conformance suite covers the
results; these tests force each interleaving and count round trips.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.store import Decision, RunView, StepOutcome, StepStatus
from pikku_celery.store.sql import SQLWorkflowStore
from tests.store.conftest import wipe
from tests.store.support import SHORT, TASK, claim, lapse, make_tasks, task
from tests.store.wire import on_wire, round_trips, warm_up


@pytest.fixture
def pg_store(store_pg_engine: sa.Engine) -> SQLWorkflowStore:
    wipe(store_pg_engine)
    return SQLWorkflowStore(store_pg_engine)


def test_version_moved_between_read_and_write_falls_back(pg_store: SQLWorkflowStore) -> None:
    store = pg_store
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    views: list[RunView] = []

    def decide(view: RunView) -> Decision:
        views.append(view)
        if len(views) == 1:  # a signal lands after the read: the version moves
            store.send_signal(run.id, "late", {"v": 1})
        return Decision(new_steps=[task("next", 1)])

    before = store.get_run(run.id)
    assert before is not None
    result = store.advance(run.id, StepOutcome(step.id, got.attempt, ok=True, result=5), decide)
    assert len(views) == 2  # the locked pass decided again, on fresh state
    assert views[0].signals == {} and views[1].signals == {"late": {"v": 1}}
    assert views[1].steps[0].status == StepStatus.SUCCEEDED  # the outcome, once
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "next"]
    assert result.run.version == before.version + 2 == store.get_run(run.id).version  # type: ignore[union-attr]
    [a] = store.get_attempts(run.id)
    assert a.result == 5


def test_outcome_superseded_between_read_and_write_writes_nothing(
    pg_store: SQLWorkflowStore,
) -> None:
    store = pg_store
    run, [step] = make_tasks(store, 1, max_attempts=2)
    stale = claim(store, step, "old", lease=SHORT)
    calls: list[RunView] = []

    def decide(view: RunView) -> Decision:
        calls.append(view)
        lapse(store, stale)  # ... and a newer attempt takes the step over
        claim(store, step, "new")
        return Decision(new_steps=[task("next", 1)])

    before = store.get_run(run.id)
    with pytest.raises(WorkflowStepSupersededError):
        store.advance(run.id, StepOutcome(step.id, stale.attempt, ok=True, result="x"), decide)
    assert len(calls) == 1
    assert store.get_run(run.id) == before
    now = store.get_step(step.id)
    assert now is not None and now.attempt == 2 and now.status == StepStatus.RUNNING
    assert [s.name for s in store.get_steps(run.id)] == ["s0"]


def test_fan_out_takes_the_locked_pass(pg_store: SQLWorkflowStore) -> None:
    store = pg_store
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    calls: list[RunView] = []

    def decide(view: RunView) -> Decision:
        calls.append(view)
        return Decision(new_steps=[task("a", 1), task("b", 2)])

    result = store.advance(run.id, StepOutcome(step.id, got.attempt, ok=True, result=1), decide)
    assert len(calls) == 2  # the locked pass decided again; the outcome landed once
    assert [(s.status, s.result) for s in calls[1].steps] == [(StepStatus.SUCCEEDED, 1)]
    assert [a.status.value for a in store.get_attempts(run.id)] == ["succeeded"]
    assert [s.name for s in result.steps] == ["a", "b"]
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "a", "b"]


def _round_trips(engine: sa.Engine, fn: Callable[[], object]) -> int:
    return round_trips(on_wire(engine, fn)[1])


def test_a_sequential_step_costs_two_round_trips(pg_one_store: SQLWorkflowStore) -> None:
    """claim + the run's view: 1; complete + next step + run update: 1 (the
    pass reuses what the claim read). Counted once the connection has
    prepared its statements (one more round trip each, once per connection)."""
    store = pg_one_store

    warm_up(store)
    run, [step] = make_tasks(store, 1)
    engine = store.engine
    claimed: list[object] = []
    assert (
        _round_trips(engine, lambda: claimed.append(store.claim_step(step.id, TASK, "w", 60_000)))
        == 1
    )
    outcome = StepOutcome(step.id, 1, ok=True, result={"r": 1})
    decide = lambda view: Decision(new_steps=[task("next", 1)])  # noqa: E731
    assert _round_trips(engine, lambda: store.advance(run.id, outcome, decide)) == 1
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "next"]
    nxt = store.get_steps(run.id)[1]
    assert _round_trips(engine, lambda: store.claim_step(nxt.id, TASK, "w", 60_000)) == 1
    assert _round_trips(engine, lambda: store.complete_step(nxt.id, 1, "done")) == 1
