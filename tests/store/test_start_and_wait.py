"""Start and wait: a run made with its first pass in one round trip
(PostgreSQL, MySQL/MariaDB), and on PostgreSQL a run this process started
waited for without reading it.

``start_run`` writes the run and the one step its first pass records in one
write (PostgreSQL's statement, MariaDB's batch: its round trip is counted in
``test_optimistic.py``), its "now" the database's clock as last read; any other first
pass (or no recent reading of the clock, or an idempotency key) only
creates the run, for the usual pass. The settle notice of a pass that ends
a run carries its outcome, and the listener heard every notice since it
began listening: so ``RunHandle.wait`` on a run started here reads nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import pytest
import sqlalchemy as sa

from pikku_celery.engine import Context, WorkflowEngine
from pikku_celery.engine.known_runs import KnownRuns
from pikku_celery.engine.passes import start_pass
from pikku_celery.errors import WorkflowFailedError
from pikku_celery.model.plan import plan_pass
from pikku_celery.store import Decision, NewRun, RunStatus, RunView, StepStatus
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.store.conftest import wipe
from tests.store.support import TASK, task
from tests.store.wire import on_wire, round_trips, warm_up


def one_step(view: RunView) -> Decision:
    return Decision(new_steps=[task("first", 0)], wake_at=None)


def test_a_run_and_its_first_step_are_written_in_one_round_trip(
    pg_one_store: SQLWorkflowStore,
) -> None:
    store, runs = pg_one_store, KnownRuns()
    warm_up(store)
    start_pass(store, store, NewRun(workflow="wf", input=None), one_step, runs)  # clock read
    start_pass(
        store, store, NewRun(workflow="wf", input=None), one_step, runs
    )  # its statement is prepared
    new = NewRun(workflow="wf", input={"n": 1})
    result, wire = on_wire(store.engine, partial(start_pass, store, store, new, one_step, runs))
    assert result is not None and round_trips(wire) == 1
    run = store.get_run(new.id)
    assert run is not None and run == result.run
    assert (run.version, run.status, run.input) == (2, RunStatus.RUNNING, {"n": 1})
    assert abs(run.created_at - store.now_ms()) < 5_000
    [step] = store.get_steps(new.id)
    assert result.steps == [step]  # published as stored
    assert (step.name, step.task_name, step.status) == ("first", TASK, StepStatus.SCHEDULED)


def test_a_start_with_no_clock_reading_creates_the_run_then_passes(
    server_engine: sa.Engine,
) -> None:
    store, runs = store_for(server_engine), KnownRuns()  # no reading yet
    new = NewRun(workflow="wf", input=1)
    result = start_pass(store, store, new, one_step, runs)
    assert [s.name for s in result.steps] == ["first"]
    run = store.get_run(new.id)
    assert run is not None and run == result.run and run.version == 2
    assert runs.clock() is not None  # the next start needs no read of the clock


@pytest.mark.parametrize("case", ["idempotency key", "several steps", "run ends at once"])
def test_any_other_start_writes_nothing(server_engine: sa.Engine, case: str) -> None:
    store = store_for(server_engine)
    new = NewRun(workflow="wf", input=1, idempotency_key="k" if case == "idempotency key" else None)

    def decide(view: RunView) -> Decision:
        if case == "several steps":
            return Decision(new_steps=[task("a", 0), task("b", 1)])
        if case == "run ends at once":
            return Decision(run_status=RunStatus.COMPLETED, output=1)
        return one_step(view)

    read = store.start_view(new, store.now_ms())
    if case == "idempotency key":
        assert read is None  # the engine creates the run, then takes the pass
        return
    assert read is not None
    assert store.write_start(new, read, plan_pass(read.view, None, decide(read.view))) is None
    assert store.get_run(new.id) is None  # the engine creates it, then takes the pass


def test_a_first_pass_that_raises_leaves_the_run_to_fail(server_engine: sa.Engine) -> None:
    store = store_for(server_engine)
    store.create_run(NewRun(workflow="wf", input=None))
    new = NewRun(workflow="wf", input=None)

    def broken(view: RunView) -> Decision:
        raise ValueError("a bug in the body")

    with pytest.raises(ValueError):
        start_pass(store, store, new, broken)
    assert store.get_run(new.id) is not None  # so the engine can record the failure


@pytest.fixture
def engine(store_pg_engine: sa.Engine) -> Iterator[tuple[WorkflowEngine, InlineDispatcher]]:
    wipe(store_pg_engine)
    yield make_engine(store_for(store_pg_engine))


def test_waiting_on_a_run_started_here_reads_nothing(
    engine: tuple[WorkflowEngine, InlineDispatcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    wf, dispatcher = engine

    @dispatcher.task
    def double(x: int) -> int:
        return 2 * x

    @dispatcher.task
    def boom() -> None:
        raise RuntimeError("boom")

    @wf.workflow(name="twice")
    def twice(ctx: Context, x: int) -> int:
        return int(ctx.step("d", double, x))

    @wf.workflow(name="fails")
    def fails(ctx: Context) -> None:
        ctx.step("b", boom)

    first = twice.start(1)
    dispatcher.run_until_idle()
    assert first.wait(timeout=10) == 2  # the listener is up from here on
    reads: list[str] = []
    store_reads = wf.store.get_run
    monkeypatch.setattr(
        wf.store, "get_run", lambda run_id: reads.append(run_id) or store_reads(run_id)
    )
    ok, bad = twice.start(21), fails.start()
    dispatcher.run_until_idle()
    assert ok.wait(timeout=10) == 42
    with pytest.raises(WorkflowFailedError) as failed:
        bad.wait(timeout=10)
    assert "boom" in str(failed.value)
    assert reads == []
    # A run whose end this process did not hear of (it ended before the
    # listener began) is read.
    assert wf.handle(first.run_id).wait(timeout=10) == 2
    assert reads == [first.run_id]
