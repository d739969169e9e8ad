"""PostgreSQL's hot path skips reads it can do without; these tests pin when.

Three shortcuts save the pass's read, and each must give ``decide`` the view
a read would have given, or read after all:

A. A new run's first pass, taken by the thread that created the run, is one
   version-checked statement decided on the run as created. A decision that
   statement cannot write (several new steps) goes to the locked pass, which
   reuses that view and decision (``decide`` runs once). Another thread's
   pass, or a locked change in between (a signal, a cancel request), reads.
B. The claim of a step this store's own optimistic pass scheduled sends the
   run's version as that pass left it; the claim then returns no step rows
   and the pass takes the steps it remembered. If another store (another
   worker process) passed the run since, the version moved and the claim
   reads the steps.
C. A claim carries at most ``CLAIM_VIEW_STEPS`` steps of its run, none when
   the claimed step's ``seq`` shows the run is bigger; a bigger run's pass
   then reads the run itself.

The conformance suite checks results whichever path a pass takes; these
tests check the path, by counting round trips (and rows) on the wire, and
that the view given to ``decide`` matches what the database holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import psycopg
import pytest
import sqlalchemy as sa

from pikku_celery.engine import Context
from pikku_celery.engine.passes import take_pass
from pikku_celery.model.values import Settled
from pikku_celery.sql.settle import SETTLED_CHANNEL, read_notice
from pikku_celery.store import (
    Decision,
    NewRun,
    RunState,
    RunStatus,
    RunView,
    StepStatus,
)
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.statements_postgres import CLAIM_VIEW_STEPS
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.store.conftest import one_connection_store
from tests.store.support import TASK, claim, make_tasks, names, task, threaded
from tests.store.wire import data_rows, longest_row, ok, on_wire, round_trips, warm_up


@pytest.fixture
def store(pg_one_store: SQLWorkflowStore) -> SQLWorkflowStore:
    """A store on a pool of one connection: the one the trace looks at."""
    return pg_one_store


@pytest.fixture
def other(store_pg_engine: sa.Engine) -> Iterator[SQLWorkflowStore]:
    """Another store on the same database: another worker process."""
    made, engine = one_connection_store(store_pg_engine.url)
    yield made
    engine.dispose()


def current(store: SQLWorkflowStore, run_id: str) -> RunState:
    run = store.get_run(run_id)
    assert run is not None
    return run


def new_run(store: SQLWorkflowStore) -> RunState:
    """A new run, created as the engine's start creates it (its first pass
    starts from it); the state ``create_run`` returns is its stored row."""
    return threaded(store).create(NewRun(workflow="wf", input={"n": 1, "xs": [1.5, "a"]}))


def test_create_run_returns_the_stored_row(store: SQLWorkflowStore) -> None:
    """The INSERT reads the clock once per column; the two reads may straddle a
    millisecond, and the state returned must still be the row (the first
    pass's shortcut compares them)."""
    for _ in range(300):
        run = new_run(store)
        assert current(store, run.id) == run


class Decider:
    """``decide`` that records every view it is given."""

    def __init__(self, decision: Callable[[RunView], Decision]) -> None:
        self.decision = decision
        self.views: list[RunView] = []

    def __call__(self, view: RunView) -> Decision:
        self.views.append(view)
        return self.decision(view)


def next_step(seq: int) -> Decider:
    return Decider(lambda view: Decision(new_steps=[task(f"s{seq}", seq)]))


# --- A: a new run's first pass ------------------------------------------------


def test_first_pass_of_a_new_run_is_one_round_trip(store: SQLWorkflowStore) -> None:
    warm_up(store)
    run = new_run(store)
    decide = next_step(0)
    result, wire = on_wire(store.engine, partial(threaded(store).take_pass, run.id, None, decide))
    assert round_trips(wire) == 1
    [view] = decide.views
    assert (view.run, view.steps, view.signals) == (run, [], {})
    [step] = store.get_steps(run.id)
    assert (step.name, step.task_name, step.seq) == ("s0", TASK, 0)
    assert step.status == StepStatus.SCHEDULED
    assert result.steps == [step]  # published as recorded
    assert result.run.version == 2
    assert result.run == current(store, run.id)


def test_first_pass_with_several_steps_decides_once(store: SQLWorkflowStore) -> None:
    """The optimistic statement writes one step: the locked pass takes over,
    finds the run as created and applies the decision already made."""
    run = new_run(store)
    decide = Decider(lambda view: Decision(new_steps=[task(f"p{i}", i) for i in range(3)]))
    result = threaded(store).take_pass(run.id, None, decide)
    assert len(decide.views) == 1
    assert decide.views[0].run == run and decide.views[0].steps == []
    steps = store.get_steps(run.id)
    assert names(steps) == ["p0", "p1", "p2"]
    assert all(s.status == StepStatus.SCHEDULED for s in steps)
    assert result.steps == steps
    assert result.run.version == 2
    assert result.run == current(store, run.id)


def test_a_pass_not_handed_the_new_run_reads_it(
    store: SQLWorkflowStore, other: SQLWorkflowStore
) -> None:
    """Only the pass the start hands the run as created skips its read. Here
    another process signals the run first: a pass not handed it (another
    message's) reads, and sees that signal."""
    run = new_run(store)
    other.send_signal(run.id, "go", {"v": 1})
    decide = next_step(0)
    result = take_pass(store, run.id, None, decide)
    [view] = decide.views  # read, not guessed (a guess would be decided again)
    assert view.signals == {"go": {"v": 1}}
    assert view.run.version == 2
    assert result.run.version == 3 == current(store, run.id).version
    assert names(store.get_steps(run.id)) == ["s0"]

    # The start's own pass comes after, on the run as created: its write
    # changes nothing (the version moved), and it decides again on what it
    # reads. Only the last view counts.
    again = Decider(lambda view: Decision(new_steps=[task("s1", 1)]))
    later = threaded(store).take_pass(run.id, None, again)
    assert [names(v.steps) for v in again.views] == [[], ["s0"]]
    assert later.run.version == 4 == current(store, run.id).version
    assert names(store.get_steps(run.id)) == ["s0", "s1"]


@pytest.mark.parametrize("change", ["signal", "cancel"])
def test_a_locked_change_after_create_makes_the_first_pass_decide_again(
    store: SQLWorkflowStore, change: str
) -> None:
    run = new_run(store)
    if change == "signal":
        store.send_signal(run.id, "go", {"v": 1})
    else:
        store.request_cancel(run.id)
    decide = next_step(0)
    result = threaded(store).take_pass(run.id, None, decide)
    # Decided on the run as created, whose write the moved version refused,
    # then on the run as read.
    assert [v.run.version for v in decide.views] == [1, 2]
    view = decide.views[-1]
    if change == "signal":
        assert view.signals == {"go": {"v": 1}}
    else:
        assert view.run.cancel_requested
    assert result.run.version == 3 == current(store, run.id).version
    assert names(store.get_steps(run.id)) == ["s0"]


# --- B: a claim after this store's own pass ----------------------------------


def test_claim_after_own_pass_takes_the_remembered_steps(store: SQLWorkflowStore) -> None:
    """Each claim is one round trip returning one row (the step and its run,
    no steps), each pass one round trip, and the steps given to ``decide``
    are those the database holds."""
    warm_up(store)
    run, [step] = make_tasks(store, 1)
    for i in range(1, 6):
        got, wire = on_wire(store.engine, partial(claim, store, step, "w"))
        assert (round_trips(wire), data_rows(wire)) == (1, 1), f"claim of {step.name}"
        decide = next_step(i)
        _, wire = on_wire(
            store.engine, partial(threaded(store).take_pass, run.id, ok(got, {"i": i}), decide)
        )
        assert round_trips(wire) == 1, f"pass after {step.name}"
        [view] = decide.views
        *before, step = store.get_steps(run.id)
        assert view.steps == before  # the remembered steps, the outcome applied
        assert [(s.name, s.status, s.result) for s in view.steps] == [
            (f"s{j}", StepStatus.SUCCEEDED, {"i": j + 1}) for j in range(i)
        ]
        assert (step.name, step.status) == (f"s{i}", StepStatus.SCHEDULED)
        assert view.run.version == i + 1
    assert current(store, run.id).version == 7


def test_a_claim_after_own_pass_does_not_read_the_input_again(
    store: SQLWorkflowStore, other: SQLWorkflowStore
) -> None:
    """A run's input (up to max_input_bytes) never changes: the claim that
    knows the run at its version gets it from the pass, not the wire."""
    warm_up(store)
    big = {"doc": "x" * 50_000}
    run, _ = store.create_run(NewRun(workflow="wf", input=big))
    threaded(store).take_pass(run.id, None, next_step(0))
    got = claim(store, store.get_steps(run.id)[0], "w")
    for i in range(1, 3):
        decide = next_step(i)
        threaded(store).take_pass(run.id, ok(got, i), decide)
        if i == 1:
            assert decide.views[0].run.input == big  # read by the first claim
        got, wire = on_wire(store.engine, partial(claim, store, store.get_steps(run.id)[i], "w"))
        assert longest_row(wire) < 5_000  # the step and the run, no input
    before = current(store, run.id)
    decide = Decider(lambda view: Decision())
    threaded(store).take_pass(run.id, ok(got, 3), decide)
    [view] = decide.views
    assert view.run == before  # the run as stored, its input included
    assert view.run.input == big

    # Another store (worker process) knows nothing: its claim reads the input.
    run2, _ = other.create_run(NewRun(workflow="wf", input=big))
    threaded(other).take_pass(run2.id, None, next_step(0))
    _, wire = on_wire(store.engine, partial(claim, store, store.get_steps(run2.id)[0], "w"))
    assert longest_row(wire) > 50_000


def test_claim_after_another_stores_pass_reads_the_steps(
    store: SQLWorkflowStore, other: SQLWorkflowStore
) -> None:
    """``store`` schedules c after a; meanwhile ``other`` (another worker)
    completes the parallel step b. The claim of c must read the steps: the
    ones ``store`` remembers show b still running."""
    run, [a, b] = make_tasks(store, 2)
    got_a, got_b = claim(store, a, "w1"), claim(other, b, "w2")
    threaded(store).take_pass(run.id, ok(got_a, "A"), next_step(2))
    threaded(other).take_pass(run.id, ok(got_b, "B"), lambda view: Decision())
    c = store.get_steps(run.id)[2]
    got, wire = on_wire(store.engine, partial(claim, store, c, "w1"))
    assert data_rows(wire) == 3  # the run moved on: the claim read its steps
    decide = Decider(lambda view: Decision())
    threaded(store).take_pass(run.id, ok(got, "C"), decide)
    [view] = decide.views
    assert [(s.name, s.status, s.result) for s in view.steps] == [
        ("s0", StepStatus.SUCCEEDED, "A"),
        ("s1", StepStatus.SUCCEEDED, "B"),
        ("s2", StepStatus.SUCCEEDED, "C"),
    ]
    assert view.steps == store.get_steps(run.id)
    assert view.run.version == 4


def test_signal_from_another_store_reaches_the_next_pass(
    store: SQLWorkflowStore, other: SQLWorkflowStore
) -> None:
    run, [s0] = make_tasks(store, 1)
    threaded(store).take_pass(run.id, ok(claim(store, s0, "w"), 0), next_step(1))
    other.send_signal(run.id, "go", {"v": 1})
    s1 = store.get_steps(run.id)[1]
    got, wire = on_wire(store.engine, partial(claim, store, s1, "w"))
    assert data_rows(wire) == 3  # the run as it stands (the signal moved it), its signal
    decide = Decider(lambda view: Decision())
    threaded(store).take_pass(run.id, ok(got, 1), decide)
    [view] = decide.views
    assert view.signals == {"go": {"v": 1}}
    assert [(s.name, s.result) for s in view.steps] == [("s0", 0), ("s1", 1)]
    assert view.steps == store.get_steps(run.id)


# --- C: a claim in a big run --------------------------------------------------


@pytest.mark.parametrize(
    ("size", "seq", "rows", "kept"),
    [
        (70, 69, 1, False),  # the step's seq shows a big run: no steps read
        (70, 3, CLAIM_VIEW_STEPS + 1, False),  # more steps than the claim carries
        (65, 0, CLAIM_VIEW_STEPS + 1, False),
        (65, 64, 1, False),
        (64, 63, 64, True),  # the biggest run a claim carries whole
    ],
)
def test_claim_in_a_big_run(
    store: SQLWorkflowStore, size: int, seq: int, rows: int, kept: bool
) -> None:
    assert CLAIM_VIEW_STEPS == 64  # the cases above are built around it
    warm_up(store)
    run, steps = make_tasks(store, size)
    got, wire = on_wire(store.engine, partial(claim, store, steps[seq], "w"))
    assert data_rows(wire) == rows
    decide = Decider(lambda view: Decision())
    _, wire = on_wire(
        store.engine, partial(threaded(store).take_pass, run.id, ok(got, {"seq": seq}), decide)
    )
    # the pass reads the run itself unless the claim's view was kept
    assert round_trips(wire) == (1 if kept else 2)
    [view] = decide.views
    assert len(view.steps) == size
    assert names(view.steps) == [f"s{i}" for i in range(size)]
    done = view.steps[seq]
    assert (done.status, done.result, done.attempt) == (StepStatus.SUCCEEDED, {"seq": seq}, 1)
    assert all(s.status == StepStatus.SCHEDULED for i, s in enumerate(view.steps) if i != seq)
    assert view.steps == store.get_steps(run.id)
    assert current(store, run.id).version == 3


def test_claim_after_own_pass_in_a_big_run_takes_the_remembered_steps(
    store: SQLWorkflowStore,
) -> None:
    """A big run's claim reads no steps, but after this store's own pass it
    has them all: the pass then needs no read."""
    size = CLAIM_VIEW_STEPS + 6
    warm_up(store)
    run, steps = make_tasks(store, size)
    last = claim(store, steps[-1], "w")
    threaded(store).take_pass(run.id, ok(last, "last"), next_step(size))
    new = store.get_steps(run.id)[-1]
    assert new.seq == size
    got, wire = on_wire(store.engine, partial(claim, store, new, "w"))
    assert data_rows(wire) == 1
    decide = Decider(lambda view: Decision())
    _, wire = on_wire(
        store.engine, partial(threaded(store).take_pass, run.id, ok(got, "new"), decide)
    )
    assert round_trips(wire) == 1
    [view] = decide.views
    assert len(view.steps) == size + 1
    assert [s.result for s in view.steps[-2:]] == ["last", "new"]
    assert view.steps == store.get_steps(run.id)


# --- the settle NOTIFY ---------------------------------------------------------


@contextmanager
def settle_notes(url: sa.URL) -> Iterator[Callable[[], list[tuple[str, Settled | None]]]]:
    """A LISTEN on the settle channel; the callable returns every run id
    announced so far with the outcome its notice carried, read up to a
    marker this test sends (notifications come in commit order, so all
    earlier ones are in)."""
    with psycopg.connect(url.set(drivername="postgresql").render_as_string(False)) as conn:
        conn.autocommit = True
        conn.execute(f"LISTEN {SETTLED_CHANNEL}")

        def read() -> list[tuple[str, Settled | None]]:
            marker = f"marker-{uuid.uuid4()}"
            conn.execute("SELECT pg_notify(%s, %s)", (SETTLED_CHANNEL, marker))
            seen: list[tuple[str, Settled | None]] = []
            for note in conn.notifies(timeout=10):
                if note.payload == marker:
                    return seen
                seen.append(read_notice(note.payload))
            raise AssertionError("the marker never came back")

        yield read


def end_run(view: RunView) -> Decision:
    return Decision(run_status=RunStatus.COMPLETED, output=len(view.steps))


def test_a_pass_ending_the_run_announces_it_in_its_own_round_trip(
    store: SQLWorkflowStore, store_pg_engine: sa.Engine
) -> None:
    warm_up(store)
    run, [step] = make_tasks(store, 1)
    threaded(store).take_pass(
        run.id, ok(claim(store, step, "w")), end_run
    )  # prepares the statement
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    with settle_notes(store_pg_engine.url) as notes:
        result, wire = on_wire(
            store.engine, partial(threaded(store).take_pass, run.id, ok(got), end_run)
        )
        assert round_trips(wire) == 1
        assert result.run.status == RunStatus.COMPLETED == current(store, run.id).status
        # once, with the outcome: a waiter needs no read
        assert notes() == [(run.id, Settled(RunStatus.COMPLETED, 1, None))]


def test_a_locked_pass_ending_the_run_announces_it_once(
    store: SQLWorkflowStore, other: SQLWorkflowStore, store_pg_engine: sa.Engine
) -> None:
    run, [step] = make_tasks(store, 1)
    threaded(other).take_pass(run.id, ok(claim(other, step, "w")), next_step(1))
    with settle_notes(store_pg_engine.url) as notes:
        # A pass with no outcome, not by the creating thread: the locked pass.
        result = threaded(other).take_pass(run.id, None, end_run)
        assert result.run.status == RunStatus.COMPLETED
        assert notes() == [(run.id, Settled(RunStatus.COMPLETED, 2, None))]


def test_a_pass_that_misses_announces_nothing(
    store: SQLWorkflowStore, other: SQLWorkflowStore, store_pg_engine: sa.Engine
) -> None:
    """The ending statement of a pass whose version moved writes nothing and
    sends nothing; the locked pass that takes over announces the end once."""
    warm_up(store)
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    other.send_signal(run.id, "go", None)  # the version moves after the claim read it
    with settle_notes(store_pg_engine.url) as notes:
        result = threaded(store).take_pass(run.id, ok(got), end_run)
        assert result.run.status == RunStatus.COMPLETED
        assert notes() == [(run.id, Settled(RunStatus.COMPLETED, 1, None))]


# --- E: through the engine: a step's claim, body and pass ---------------------


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "broker"])
def test_through_the_engine_a_step_costs_its_counted_round_trips(
    pg_one_store: SQLWorkflowStore, eager: bool
) -> None:
    """The engine hands each pass the view its claim read (or the eager
    claim's pass wrote) and each claim the run its scheduling pass left: an
    eager step is 1 round trip (its pass), a broker step 2 (claim, pass)."""
    store = pg_one_store
    warm_up(store)
    engine, dispatcher = make_engine(store, dispatcher=InlineDispatcher(eager=eager))

    @dispatcher.task
    def add(x: int) -> int:
        return x + 1

    @engine.workflow(name="seq")
    def seq(ctx: Context, x: int) -> int:
        for i in range(STEPS):
            x = ctx.step(f"s{i}", add, x)
        return x

    seq.start(0)
    dispatcher.run_until_idle(timeout=15)  # every statement prepared on the connection
    handle = seq.start(0)
    _, wire = on_wire(store.engine, lambda: dispatcher.run_until_idle(timeout=15))
    assert handle.result() == STEPS
    # the first step's message: its claim, then each step's pass (and, by
    # broker, each later step's claim)
    assert round_trips(wire) == (1 + STEPS if eager else 2 * STEPS)


STEPS = 6
