"""A pass that sets progress events beside its next step stays one write.

``ctx.set_event`` records a settled value step in the pass that reaches it;
the optimistic pass (PostgreSQL's one statement, MariaDB's one batch with
its COMMIT) writes it beside the pass's one new step, so an event costs the
pass a row, not a round trip, and the view kept for the next pass holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.ports.store import RunStarts
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import (
    Decision,
    NewRun,
    NewStep,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepStatus,
)
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.store.sql_optimistic import MAX_PASS_VALUES
from tests.mysql_round_trips import counting
from tests.store.support import TASK, make_tasks, task, threaded
from tests.store.wire import on_wire, round_trips, warm_up


def event(key: str, number: int, seq: int, value: object) -> NewStep:
    return NewStep(f"event:{key}#{number}", seq, StepKind.VALUE, StepStatus.SUCCEEDED, result=value)


def _trips(store: SQLWorkflowStore, fn: Callable[[], object]) -> int:
    """What ``fn`` sends the server, in round trips."""
    if store.engine.dialect.name == "postgresql":
        return round_trips(on_wire(store.engine, fn)[1])
    with counting() as sent:
        fn()
    return sent[0]


@pytest.fixture
def one_store(server_engine: sa.Engine) -> Iterator[SQLWorkflowStore]:
    """A store on one connection (what the wire shows is all it sent)."""
    url = server_engine.url.render_as_string(hide_password=False)
    store = store_for(make_engine(url, pool_size=1, max_overflow=0))
    warm_up(store)
    yield store
    store.engine.dispose()


def _two_passes(store: SQLWorkflowStore) -> tuple[list[int], list[str], list[str]]:
    """A step's pass that sets two events beside the next step, then that
    step's pass with one more event: the round trips of each, the steps the
    second pass was shown, and the run's steps after."""
    run, [step] = make_tasks(store, 1)
    claimed = threaded(store).claim(step.id, TASK, "w", 60_000)
    assert claimed is not None
    outcome = StepOutcome(step.id, 1, ok=True, result=1, claim_id=claimed.claim_id)
    decided = Decision(
        new_steps=[event("progress", 0, 1, {"done": 1}), event("stage", 0, 2, "x"), task("s1", 3)]
    )
    trips = [
        _trips(store, lambda: threaded(store).take_pass(run.id, outcome, lambda view: decided))
    ]
    assert [(s.name, s.status, s.result) for s in store.get_steps(run.id)[1:3]] == [
        ("event:progress#0", StepStatus.SUCCEEDED, {"done": 1}),
        ("event:stage#0", StepStatus.SUCCEEDED, "x"),
    ]
    nxt = threaded(store).claim(store.get_steps(run.id)[3].id, TASK, "w", 60_000)
    assert nxt is not None
    seen: list[RunView] = []

    def decide(view: RunView) -> Decision:
        seen.append(view)
        return Decision(new_steps=[event("progress", 1, 4, {"done": 2}), task("s2", 5)])

    done = StepOutcome(nxt.id, 1, ok=True, result=2, claim_id=nxt.claim_id)
    trips.append(_trips(store, lambda: threaded(store).take_pass(run.id, done, decide)))
    return trips, [s.name for s in seen[-1].steps], [s.name for s in store.get_steps(run.id)]


def test_events_beside_the_next_step_are_one_write_and_kept_in_the_view(
    one_store: SQLWorkflowStore,
) -> None:
    _two_passes(one_store)  # each statement's first run on a connection prepares it
    trips, shown, steps = _two_passes(one_store)
    assert trips == [1, 1]
    # The second pass was shown the events without reading the run again.
    assert shown == ["s0", "event:progress#0", "event:stage#0", "s1"]
    assert steps == [*shown, "event:progress#1", "s2"]


def test_more_events_than_one_write_takes_are_written_by_the_locked_pass(
    one_store: SQLWorkflowStore,
) -> None:
    store = one_store
    run, [step] = make_tasks(store, 1)
    claimed = threaded(store).claim(step.id, TASK, "w", 60_000)
    assert claimed is not None
    many = [event("tick", i, i + 1, i) for i in range(MAX_PASS_VALUES + 1)]
    decided = Decision(new_steps=[*many, task("s1", len(many) + 1)])
    outcome = StepOutcome(step.id, 1, ok=True, result=1, claim_id=claimed.claim_id)
    assert (
        _trips(store, lambda: threaded(store).take_pass(run.id, outcome, lambda view: decided)) > 1
    )
    names = [s.name for s in store.get_steps(run.id)]
    assert names == ["s0", *[f"event:tick#{i}" for i in range(MAX_PASS_VALUES + 1)], "s1"]


def _start(store: SQLWorkflowStore) -> tuple[int, NewRun, list[RunView]]:
    """A run whose first pass sets an event before its first step, started
    with that pass; the round trips, the run, and the view its first step's
    pass was shown."""
    new = NewRun(workflow="wf", input={"n": 1})
    first = Decision(new_steps=[event("stage", 0, 0, "started"), task("first", 1)])
    trips = _trips(store, lambda: threaded(store).start_pass(new, lambda view: first))
    step = store.get_steps(new.id)[1]
    claimed = threaded(store).claim(step.id, TASK, "w", 60_000)
    assert claimed is not None
    seen: list[RunView] = []

    def decide(view: RunView) -> Decision:
        seen.append(view)
        return Decision(run_status=RunStatus.COMPLETED, output=1)

    outcome = StepOutcome(step.id, 1, ok=True, result=1, claim_id=claimed.claim_id)
    threaded(store).take_pass(new.id, outcome, decide)
    return trips, new, seen


def test_a_run_whose_first_pass_sets_an_event_starts_in_one_write(
    one_store: SQLWorkflowStore,
) -> None:
    assert isinstance(one_store, RunStarts)
    threaded(one_store).create(NewRun(workflow="wf", input=None))  # the clock is read
    _start(one_store)  # each statement's first run on a connection prepares it
    trips, new, seen = _start(one_store)
    assert trips == 1
    assert [(s.name, s.status) for s in one_store.get_steps(new.id)] == [
        ("event:stage#0", StepStatus.SUCCEEDED),
        ("first", StepStatus.SUCCEEDED),
    ]
    assert [s.name for s in seen[-1].steps] == ["event:stage#0", "first"]
    run = one_store.get_run(new.id)
    assert run is not None and run.status == RunStatus.COMPLETED
