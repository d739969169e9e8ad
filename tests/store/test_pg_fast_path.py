"""The store's claim and optimistic pass run straight on libpq (``pikku_celery.sql.libpq``).

The conformance suite checks what a claim and a pass do, whichever path they
take; these tests check how the store takes the fast one. Both statements
are server-side prepared statements of the store's own (``pikku_``, not the
lease service's ``pikku_lease_``); statement listeners still see them (the
general path); a connection killed under them costs one failed call, with
nothing half-written, and the next call reconnects; statements the server
forgot (``DEALLOCATE ALL``) are prepared again on the same connection.

Every test runs on an engine whose pool holds one connection, so the
connection looked at is the one the store ran on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from pikku_celery.errors import StoreError
from pikku_celery.sql.libpq import PgConnection, PgStatement
from pikku_celery.sql.runner import LibpqRunner
from pikku_celery.store import AdvanceResult, Decision, NewRun, RunView, StepOutcome, StepStatus
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from tests.services import terminate_backend
from tests.store.support import TASK, claim, make_tasks, task, threaded
from tests.store.wire import on_wire, round_trips


@pytest.fixture
def store(pg_one_store: SQLWorkflowStore) -> SQLWorkflowStore:
    return pg_one_store


def compiled(store: SQLWorkflowStore, name: str) -> PgStatement:
    """The store's statement ``name`` as the fast path runs it (same name, same SQL)."""
    assert isinstance(store.runner, LibpqRunner)
    return PgStatement.compile(store.statements.named()[name], store.engine.dialect)


def claim_sql(store: SQLWorkflowStore) -> PgStatement:
    return compiled(store, "claim_view")


def pass_sql(store: SQLWorkflowStore) -> PgStatement:
    """The pass a completed step and one new step make (``cycle``'s)."""
    return compiled(store, "pass_write[complete,step]")


def decide(view: RunView) -> Decision:
    return Decision(new_steps=[task("next", 1)])


def outcome(step_id: str, attempt: int = 1) -> StepOutcome:
    return StepOutcome(step_id, attempt, ok=True, result={"r": 1})


def check_passed(store: SQLWorkflowStore, run_id: str, result: AdvanceResult) -> None:
    """The step succeeded; the next one is recorded, scheduled and handed back."""
    first, nxt = store.get_steps(run_id)
    assert (first.status, first.result) == (StepStatus.SUCCEEDED, {"r": 1})
    assert (nxt.name, nxt.status) == ("next", StepStatus.SCHEDULED)
    assert [s.id for s in result.steps] == [nxt.id]
    assert [a.status.value for a in store.get_attempts(run_id)] == ["succeeded"]


def cycle(store: SQLWorkflowStore) -> None:
    """A new run's step: claimed, then passed with one new step."""
    run, [step] = make_tasks(store, 1)
    got = claim(store, step, "w")
    assert got.attempt == 1 and got.status == StepStatus.RUNNING
    check_passed(store, run.id, threaded(store).take_pass(run.id, outcome(step.id), decide))


@contextmanager
def driver_of(engine: sa.Engine) -> Iterator[psycopg.Connection[Any]]:
    """The psycopg connection the store runs on (its pool holds just one)."""
    fairy = engine.raw_connection()
    try:
        driver = fairy.driver_connection
        assert isinstance(driver, psycopg.Connection)
        yield driver
    finally:
        fairy.close()


def prepared(engine: sa.Engine) -> set[str]:
    """The store's and the lease service's prepared statements on that connection."""
    with driver_of(engine) as driver:
        rows = driver.execute("SELECT name FROM pg_prepared_statements").fetchall()
    return {name for (name,) in rows if name.startswith("pikku_")}


def backend_pid(engine: sa.Engine) -> int:
    with driver_of(engine) as driver:
        return driver.info.backend_pid


def test_claim_and_pass_run_as_the_stores_prepared_statements(store: SQLWorkflowStore) -> None:
    cycle(store)
    names = prepared(store.engine)
    assert {claim_sql(store).name.decode(), pass_sql(store).name.decode()} <= names
    assert not any(n.startswith("pikku_lease_") for n in names)


def test_statement_listeners_see_the_claim_and_the_pass(store: SQLWorkflowStore) -> None:
    seen: list[str] = []

    def record(conn: sa.Connection, cursor: Any, statement: str, *rest: Any) -> None:
        seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    cycle(store)
    assert seen.count(claim_sql(store).sql) == 1
    assert seen.count(pass_sql(store).sql) == 1
    assert prepared(store.engine) == set()  # nothing went the fast path


def test_a_killed_connection_fails_one_claim_then_reconnects(
    store: SQLWorkflowStore, store_pg_engine: sa.Engine
) -> None:
    cycle(store)  # the statements are prepared on the connection
    run, [step] = make_tasks(store, 1)
    pid = backend_pid(store.engine)
    terminate_backend(store_pg_engine, pid)

    with pytest.raises(sa.exc.OperationalError) as info:
        threaded(store).claim(step.id, TASK, "w", 60_000, run_id=step.run_id)
    assert info.value.connection_invalidated
    assert isinstance(info.value.orig, psycopg.OperationalError)
    assert info.value.statement == claim_sql(store).sql
    assert store.get_step(step.id) == step  # not claimed
    assert store.get_attempts(run.id) == []

    assert claim(store, step, "w").attempt == 1
    assert backend_pid(store.engine) != pid
    check_passed(store, run.id, threaded(store).take_pass(run.id, outcome(step.id), decide))
    assert claim_sql(store).name.decode() in prepared(store.engine)


def test_a_killed_connection_fails_one_pass_then_reconnects(
    store: SQLWorkflowStore, store_pg_engine: sa.Engine
) -> None:
    cycle(store)
    run, [step] = make_tasks(store, 1)
    running = claim(store, step, "w")
    before = store.get_run(run.id)
    pid = backend_pid(store.engine)
    terminate_backend(store_pg_engine, pid)

    with pytest.raises(sa.exc.OperationalError) as info:
        threaded(store).take_pass(run.id, outcome(step.id), decide)
    assert info.value.connection_invalidated
    assert info.value.statement == pass_sql(store).sql
    assert store.get_run(run.id) == before  # nothing written
    assert store.get_steps(run.id) == [running]
    assert [a.status.value for a in store.get_attempts(run.id)] == ["running"]

    check_passed(store, run.id, threaded(store).take_pass(run.id, outcome(step.id), decide))
    assert backend_pid(store.engine) != pid
    assert pass_sql(store).name.decode() in prepared(store.engine)


def test_statements_the_server_forgot_are_prepared_again(store: SQLWorkflowStore) -> None:
    cycle(store)
    pid = backend_pid(store.engine)
    with driver_of(store.engine) as driver:
        driver.execute("DEALLOCATE ALL")
    assert prepared(store.engine) == set()

    cycle(store)
    names = prepared(store.engine)
    assert {claim_sql(store).name.decode(), pass_sql(store).name.decode()} <= names
    assert backend_pid(store.engine) == pid  # the same connection, not a new one


def test_the_claim_and_the_pass_return_their_connection_without_a_rollback(
    store: SQLWorkflowStore,
) -> None:
    # libpq leaves the connection idle after each statement: the pool's reset
    # (a ROLLBACK through psycopg) would only cost time.
    resets: list[bool] = []

    def record(_dbapi: Any, _record: Any, state: Any) -> None:
        resets.append(state.transaction_was_reset)

    cycle(store)
    sa.event.listen(store.engine.pool, "reset", record)
    run, [step] = make_tasks(store, 1)
    resets.clear()
    claim(store, step, "w")
    threaded(store).take_pass(run.id, outcome(step.id), decide)
    assert resets == [True, True]  # the claim's and the pass's, no ROLLBACK


def test_a_refused_connection_fails_the_claim_as_the_general_path_would(
    store: SQLWorkflowStore,
) -> None:
    run, [step] = make_tasks(store, 1)
    pool = store.engine.pool
    pool.dispose()  # the next checkout connects

    def refuse(*_: Any) -> Any:
        raise psycopg.OperationalError("connection refused (test)")

    sa.event.listen(store.engine, "do_connect", refuse)
    try:
        with pytest.raises(sa.exc.OperationalError) as info:
            threaded(store).claim(step.id, TASK, "w", 60_000, run_id=step.run_id)
    finally:
        sa.event.remove(store.engine, "do_connect", refuse)
    assert isinstance(info.value.orig, psycopg.OperationalError)
    assert pool.checkedout() == 0

    assert claim(store, step, "w").attempt == 1
    check_passed(store, run.id, threaded(store).take_pass(run.id, outcome(step.id), decide))
    assert pool.checkedout() == 0


def test_a_run_is_created_and_read_by_prepared_statements_in_one_round_trip_each(
    store: SQLWorkflowStore,
) -> None:
    # Each start of a run and each RunHandle.wait pays for these.
    cycle(store)
    run, _ = store.create_run(NewRun(workflow="wf", input={"n": 1}))  # prepares both
    assert store.get_run(run.id) == run
    made, wire = on_wire(store.engine, lambda: store.create_run(NewRun(workflow="wf", input=[1])))
    assert made[1] and round_trips(wire) == 1
    read, wire = on_wire(store.engine, lambda: store.get_run(made[0].id))
    assert read == made[0] and round_trips(wire) == 1
    names = prepared(store.engine)
    made, read = compiled(store, "run_insert_returning"), compiled(store, "run_get")
    assert {made.name.decode(), read.name.decode()} <= names


def test_connection_listeners_see_the_fast_path_s_connections(store: SQLWorkflowStore) -> None:
    # An engine_connect listener (no statement listener): the fast path still
    # runs, through a Connection, so the listener sees each one it uses.
    connected: list[sa.Connection] = []
    sa.event.listen(store.engine, "engine_connect", connected.append)
    run, [step] = make_tasks(store, 1)
    connected.clear()
    got = claim(store, step, "w")
    assert len(connected) == 1
    check_passed(store, run.id, threaded(store).take_pass(run.id, outcome(got.id), decide))
    assert {claim_sql(store).name.decode(), pass_sql(store).name.decode()} <= prepared(store.engine)


def test_a_refused_insert_leaves_the_connection_in_the_pool_and_usable(
    store: SQLWorkflowStore,
) -> None:
    run, _ = store.create_run(NewRun(workflow="wf", input={}))
    pid = backend_pid(store.engine)
    with pytest.raises(StoreError):  # the same id twice: a unique violation
        store.create_run(NewRun(workflow="wf", input={}, id=run.id))
    assert store.engine.pool.checkedout() == 0
    assert backend_pid(store.engine) == pid  # not a disconnect: the connection stays
    cycle(store)


def test_an_interrupt_mid_statement_drops_the_connection_and_the_next_call_reconnects(
    store: SQLWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A signal handler's exception (Ctrl-C, Celery's soft time limit) while a
    # statement waits: the connection's line is in an unknown state.
    cycle(store)
    _, [step] = make_tasks(store, 1)
    pid = backend_pid(store.engine)
    wait = PgConnection._wait

    def interrupted(self: PgConnection) -> Any:
        monkeypatch.setattr(PgConnection, "_wait", wait)
        raise KeyboardInterrupt

    monkeypatch.setattr(PgConnection, "_wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        threaded(store).claim(step.id, TASK, "w", 60_000, run_id=step.run_id)
    assert store.engine.pool.checkedout() == 0
    got = threaded(store).claim(
        step.id, TASK, "w", 60_000, run_id=step.run_id
    )  # on a new connection
    assert backend_pid(store.engine) != pid
    # The interrupted claim may have landed before the wait was cut short:
    # then this one finds the step running, as a redelivery would.
    if got is None:
        assert store.get_step(step.id).status == StepStatus.RUNNING  # type: ignore[union-attr]
    else:
        assert got.attempt == 1


@pytest.mark.parametrize("durable", [False, True])
def test_a_claim_commits_asynchronously_unless_claims_are_durable(
    store: SQLWorkflowStore, durable: bool
) -> None:
    # The claim statement turns synchronous_commit off for its own
    # transaction; Pikku(durable_claims=True) runs the claim that waits.
    asynchronous, waiting = compiled(store, "claim_view"), compiled(store, "claim_view_durable")
    assert "set_config('synchronous_commit', 'off', true)" in asynchronous.sql
    assert "synchronous_commit" not in waiting.sql
    claiming = store_for(store.engine, durable_claims=durable)
    _, [step] = make_tasks(claiming, 1)
    assert claim(claiming, step, "w").claim_id is not None
    used = (waiting if durable else asynchronous).name.decode()
    unused = (asynchronous if durable else waiting).name.decode()
    names = prepared(store.engine)
    assert used in names and unused not in names
