"""The optimistic pass (PostgreSQL, MySQL/MariaDB): one read, one version-checked write.

Between the read and the write another pass, a signal or a new claim may
land; the write must then change nothing and the pass fall back to the
locked one (or refuse a superseded outcome). The conformance suite covers the
results; these tests force each interleaving on both servers and count round
trips (PostgreSQL's one statement, MariaDB's one batch with its COMMIT).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.ports.store import RunStarts
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import (
    Decision,
    NewRun,
    RunStatus,
    RunView,
    StepOutcome,
    StepState,
    StepStatus,
)
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from tests.mysql_round_trips import counting
from tests.store.conftest import wipe
from tests.store.support import SHORT, TASK, claim, lapse, make_tasks, race, task, threaded
from tests.store.wire import on_wire, round_trips, warm_up


@pytest.fixture
def opt_store(server_engine: sa.Engine) -> SQLWorkflowStore:
    return store_for(server_engine)


def test_version_moved_between_read_and_write_falls_back(
    opt_store: SQLWorkflowStore,
) -> None:
    store = opt_store
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
    result = threaded(store).take_pass(
        run.id, StepOutcome(step.id, got.attempt, ok=True, result=5), decide
    )
    assert len(views) == 2  # the locked pass decided again, on fresh state
    assert views[0].signals == {} and views[1].signals == {"late": {"v": 1}}
    assert views[1].steps[0].status == StepStatus.SUCCEEDED  # the outcome, once
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "next"]
    assert result.run.version == before.version + 2 == store.get_run(run.id).version  # type: ignore[union-attr]
    [a] = store.get_attempts(run.id)
    assert a.result == 5


def test_outcome_superseded_between_read_and_write_writes_nothing(
    opt_store: SQLWorkflowStore,
) -> None:
    store = opt_store
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
        threaded(store).take_pass(
            run.id, StepOutcome(step.id, stale.attempt, ok=True, result="x"), decide
        )
    assert len(calls) == 1
    assert store.get_run(run.id) == before
    now = store.get_step(step.id)
    assert now is not None and now.attempt == 2 and now.status == StepStatus.RUNNING
    assert [s.name for s in store.get_steps(run.id)] == ["s0"]


def test_fan_out_takes_the_locked_pass(opt_store: SQLWorkflowStore) -> None:
    store = opt_store
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    calls: list[RunView] = []

    def decide(view: RunView) -> Decision:
        calls.append(view)
        return Decision(new_steps=[task("a", 1), task("b", 2)])

    result = threaded(store).take_pass(
        run.id, StepOutcome(step.id, got.attempt, ok=True, result=1), decide
    )
    assert len(calls) == 2  # the locked pass decided again; the outcome landed once
    assert [(s.status, s.result) for s in calls[1].steps] == [(StepStatus.SUCCEEDED, 1)]
    assert [a.status.value for a in store.get_attempts(run.id)] == ["succeeded"]
    assert [s.name for s in result.steps] == ["a", "b"]
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "a", "b"]


def test_passes_racing_on_one_run_decide_on_what_landed(opt_store: SQLWorkflowStore) -> None:
    """Eight workers' passes on one run at once, each with its step's
    outcome; the pass that sees all eight settled records the next step.
    A pass decided on a view another pass overtook must not land (its
    version pin fails and the locked pass decides again): else the last two
    would each see seven and the run would wait for ever."""
    store = opt_store
    for round_ in range(3):
        run, steps = make_tasks(store, 8)
        got = [claim(store, s, f"w{i}") for i, s in enumerate(steps)]
        before = store.get_run(run.id)
        assert before is not None

        def decide(view: RunView) -> Decision:
            if sum(s.status == StepStatus.SUCCEEDED for s in view.steps) == 8:
                return Decision(new_steps=[task("after", 8)])
            return Decision()

        def passing(step: StepState, run_id: str = run.id) -> object:
            outcome = StepOutcome(step.id, step.attempt, ok=True, result=step.name)
            return threaded(store).take_pass(run_id, outcome, decide)

        results = race(*[lambda step=step: passing(step) for step in got])
        assert [kind for kind, _ in results] == ["ok"] * 8, (round_, results)
        recorded = store.get_steps(run.id)
        assert [(s.name, s.status) for s in recorded if s.name != "after"] == [
            (s.name, StepStatus.SUCCEEDED) for s in steps
        ]
        assert [s.name for s in recorded if s.name == "after"] == ["after"], round_
        assert [a.status.value for a in store.get_attempts(run.id)] == ["succeeded"] * 8
        after = store.get_run(run.id)
        assert after is not None and after.version == before.version + 8


def _round_trips(engine: sa.Engine, fn: Callable[[], object]) -> int:
    return round_trips(on_wire(engine, fn)[1])


@pytest.fixture
def mariadb_one_store(store_mysql_engine: sa.Engine) -> Iterator[SQLWorkflowStore]:
    """A MariaDB store on one batching connection, over empty tables."""
    wipe(store_mysql_engine)
    url = store_mysql_engine.url.render_as_string(hide_password=False)
    engine = make_engine(url, pool_size=1, max_overflow=0)
    yield store_for(engine)
    engine.dispose()


def _mariadb_round_trips(fn: Callable[[], object]) -> int:
    """What ``fn`` sends MariaDB, in round trips."""
    with counting() as sent:
        fn()
    return sent[0]


def test_a_sequential_step_costs_two_round_trips_on_mariadb(
    mariadb_one_store: SQLWorkflowStore,
) -> None:
    """The claim of a step this store's pass scheduled: 1 (a batch with its
    COMMIT; the pass's view of the run is kept); its pass with the next step:
    1 (no read, one batch with its COMMIT); the same for the next step."""
    store = mariadb_one_store
    warm_up(store)
    run, [step] = make_tasks(store, 1)
    claimed: list[object] = []
    assert (
        _mariadb_round_trips(
            lambda: claimed.append(threaded(store).claim(step.id, TASK, "w", 60_000, run_id=run.id))
        )
        == 1
    )
    outcome = StepOutcome(step.id, 1, ok=True, result={"r": 1})
    decide = lambda view: Decision(new_steps=[task("next", 1)])  # noqa: E731
    assert _mariadb_round_trips(lambda: threaded(store).take_pass(run.id, outcome, decide)) == 1
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "next"]
    nxt = store.get_steps(run.id)[1]
    assert (
        _mariadb_round_trips(
            lambda: threaded(store).claim(nxt.id, TASK, "w", 60_000, run_id=run.id)
        )
        == 1
    )
    done = StepOutcome(nxt.id, 1, ok=True, result="done")
    assert (
        _mariadb_round_trips(
            lambda: threaded(store).take_pass(run.id, done, lambda view: Decision())
        )
        == 1
    )
    assert [(s.status, s.result) for s in store.get_steps(run.id)] == [
        (StepStatus.SUCCEEDED, {"r": 1}),
        (StepStatus.SUCCEEDED, "done"),
    ]
    # A claim this store's pass did not schedule: its pass reads the run
    # first (one batch with its COMMIT).
    other, [lone] = make_tasks(store_for(store.engine), 1)
    fresh = store_for(store.engine)
    fresh.prepare()  # its checks of the schema and the connection, once
    assert (
        _mariadb_round_trips(
            lambda: threaded(fresh).claim(lone.id, TASK, "w", 60_000, run_id=other.id)
        )
        == 1
    )
    landed = StepOutcome(lone.id, 1, ok=True, result=1)
    assert (
        _mariadb_round_trips(
            lambda: threaded(fresh).take_pass(other.id, landed, lambda view: Decision())
        )
        == 2
    )


def test_a_run_and_its_first_step_are_one_round_trip_on_mariadb(
    mariadb_one_store: SQLWorkflowStore,
) -> None:
    store = mariadb_one_store
    assert isinstance(store, RunStarts)
    threaded(store).create(NewRun(workflow="wf", input=None))  # the clock is read
    new = NewRun(workflow="wf", input={"n": 1})
    first = lambda view: Decision(new_steps=[task("first", 0)])  # noqa: E731
    started: list[object] = []
    assert _mariadb_round_trips(lambda: started.append(threaded(store).start_pass(new, first))) == 1
    run = store.get_run(new.id)
    assert run is not None and (run.version, run.status, run.input) == (
        2,
        RunStatus.RUNNING,
        {"n": 1},
    )
    [step] = store.get_steps(new.id)
    assert (step.name, step.status) == ("first", StepStatus.SCHEDULED)


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
        _round_trips(
            engine,
            lambda: claimed.append(
                threaded(store).claim(step.id, TASK, "w", 60_000, run_id=run.id)
            ),
        )
        == 1
    )
    outcome = StepOutcome(step.id, 1, ok=True, result={"r": 1})
    decide = lambda view: Decision(new_steps=[task("next", 1)])  # noqa: E731
    assert _round_trips(engine, lambda: threaded(store).take_pass(run.id, outcome, decide)) == 1
    assert [s.name for s in store.get_steps(run.id)] == ["s0", "next"]
    nxt = store.get_steps(run.id)[1]
    assert (
        _round_trips(
            engine, lambda: threaded(store).claim(nxt.id, TASK, "w", 60_000, run_id=run.id)
        )
        == 1
    )
    assert _round_trips(engine, lambda: store.complete_step(nxt.id, 1, "done", run_id=run.id)) == 1
