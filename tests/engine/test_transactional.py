"""Transactional steps: a task's writes commit with its fenced outcome, or not at all."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import step_connection, transactional
from pikku_celery.engine import Context, execute
from pikku_celery.engine.orchestrate import advance
from pikku_celery.errors import PikkuError, WorkflowFailedError
from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus, InMemoryWorkflowStore, WorkflowStore
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import wait_until

from .conftest import Harness, kill_renewals, lease_lapsed

ledger = sa.Table(
    "test_tx_ledger",
    sa.MetaData(),
    sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(36), nullable=False),
    sa.Column("call", sa.Integer(), nullable=False),
)


@pytest.fixture(params=["sqlite", "postgres"])
def sql_store(request: pytest.FixtureRequest) -> Iterator[SQLWorkflowStore]:
    engine: sa.Engine = request.getfixturevalue(f"{request.param}_engine")
    metadata.create_all(engine)
    ledger.create(engine, checkfirst=True)
    store = store_for(engine)
    yield store
    store.close()


def _harness(store: WorkflowStore) -> Harness:
    engine, dispatcher = make_engine(
        store, InlineDispatcher(lease_ms=300), sweep_backoff=0.0, message_grace=0.0
    )
    return Harness(engine, dispatcher)


def _rows(store: SQLWorkflowStore, run_id: str) -> list[int]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(ledger.c.call).where(ledger.c.run_id == run_id).order_by(ledger.c.id)
            ).scalars()
        )


def test_writes_commit_with_the_outcome(sql_store: SQLWorkflowStore) -> None:
    h = _harness(sql_store)

    @h.task
    @transactional
    def book(run_id: str) -> str:
        step_connection().execute(ledger.insert().values(run_id=run_id, call=h.count("book")))
        return "booked"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id)

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == "booked"
    assert _rows(sql_store, run.run_id) == [1]


def test_a_failing_body_rolls_its_writes_back_and_retries(sql_store: SQLWorkflowStore) -> None:
    h = _harness(sql_store)

    @h.task
    @transactional
    def book(run_id: str) -> str:
        n = h.count("book")
        step_connection().execute(ledger.insert().values(run_id=run_id, call=n))
        if n == 1:
            raise RuntimeError("payment gateway hiccup")
        return "booked"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id, retries=1, retry_delay=0)

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == "booked"
    assert _rows(sql_store, run.run_id) == [2]  # the failed attempt's row rolled back
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]


# SQLite holds one writer at a time: attempt 2 could not run beside attempt 1.
@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_a_superseded_attempt_reaching_commit_is_refused_and_rolled_back(
    sql_store: SQLWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _harness(sql_store)
    release_first = threading.Event()

    @h.task
    @transactional
    def book(run_id: str) -> str:
        n = h.count("book")
        step_connection().execute(ledger.insert().values(run_id=run_id, call=n))
        if n == 1:
            release_first.wait(30)  # the worker stalls past its lease
        return f"booked by call {n}"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id, retries=2)

    # No renewals: attempt 1's lease lapses while its transaction is open.
    kill_renewals(h, monkeypatch)
    run = wf.start()
    (msg,) = h.dispatcher.messages
    h.dispatcher.messages.clear()
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(h.dispatcher.deliver(msg)))
    first.start()
    try:
        wait_until(lambda: h.calls.get("book") == 1)
        step_id = run.steps()[0].step.id
        wait_until(lambda: lease_lapsed(h, step_id), timeout=5)
        h.engine.sweep()
        h.run()
        assert run.wait(timeout=5) == "booked by call 2"
    finally:
        release_first.set()
        first.join(10)
    assert results == [None]  # attempt 1's outcome was refused
    assert _rows(sql_store, run.run_id) == [2]  # and its ledger row rolled back
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED]


def test_a_transactional_step_needs_a_sql_store() -> None:
    engine, dispatcher = make_engine(InMemoryWorkflowStore())
    h = Harness(engine, dispatcher)

    @h.task
    @transactional
    def book() -> str:
        return "never"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book)

    run = wf.start()
    h.run()
    with pytest.raises(WorkflowFailedError, match="needs a SQL store"):
        run.wait(timeout=5)


def test_step_connection_outside_a_transactional_step_is_a_clear_error() -> None:
    with pytest.raises(PikkuError, match="only available inside a task marked"):
        step_connection()


@pytest.mark.parametrize("sql_store", ["postgres"], indirect=True)
def test_a_transaction_the_database_lost_is_taken_again_not_failed(
    sql_store: SQLWorkflowStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The step's connection dies mid-transaction (as in a database restart):
    nothing of it committed, so the attempt takes it again, body and all,
    rather than recording the lost connection as the step's failure."""
    h = _harness(sql_store)

    @h.task
    @transactional
    def book(run_id: str) -> str:
        n = h.count("book")
        conn = step_connection()
        conn.execute(ledger.insert().values(run_id=run_id, call=n))
        if n == 1:
            conn.execute(sa.text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return "booked"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id)  # no retries: a failure would end the run

    run = wf.start()
    h.run()
    assert run.wait(timeout=10) == "booked"
    assert _rows(sql_store, run.run_id) == [2]  # the lost transaction's row never committed
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.SUCCEEDED]
    # The log names the attempt that ran its body again (the chaos suite counts these).
    assert f"transactional step {run.run_id}:book:1; taking it again" in caplog.text


def test_a_committed_step_whose_pass_is_slow_does_not_claim_its_lease_was_lost(
    sql_store: SQLWorkflowStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The pass after a committed transactional step can outlast half the
    lease (a store 200 ms away takes seconds): nothing is left to guard then,
    and the keeper must not renew on and report "another attempt owns it"
    for a step this attempt itself completed (the cross-host suite saw it)."""
    h = _harness(sql_store)  # a 300 ms lease: the first renewal is due at 150 ms
    slow = 0.6  # the pass's store round trips, far away

    def slow_advance(*args: Any, **kwargs: Any) -> Any:
        time.sleep(slow)  # the fault: a slow store, not synchronisation
        return advance(*args, **kwargs)

    monkeypatch.setattr(execute, "advance", slow_advance)

    @h.task
    @transactional
    def book(run_id: str) -> str:
        step_connection().execute(ledger.insert().values(run_id=run_id, call=h.count("book")))
        return "booked"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id)

    with caplog.at_level(logging.INFO, logger="pikku_celery"):
        run = wf.start()
        h.run()
        assert run.wait(timeout=10) == "booked"
    assert _rows(sql_store, run.run_id) == [1]
    lost = [r.getMessage() for r in caplog.records if "lost its lease" in r.getMessage()]
    assert lost == []


def test_a_transactional_step_stopped_at_its_timeout_rolls_its_writes_back(
    sql_store: SQLWorkflowStore,
) -> None:
    h = _harness(sql_store)

    @h.task
    @transactional
    def book(run_id: str) -> str:
        call = h.count("book")
        step_connection().execute(ledger.insert().values(run_id=run_id, call=call))
        if call == 1:
            while True:
                time.sleep(0.05)
        return "booked"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("book", book, ctx.run_id, retries=1, retry_delay=0, timeout=0.3)

    run = wf.start()
    h.run(timeout=20)
    assert run.wait(timeout=5) == "booked"
    assert _rows(sql_store, run.run_id) == [2]  # the stopped attempt's row rolled back
    (hist,) = run.steps()
    assert [a.status for a in hist.attempts] == [AttemptStatus.FAILED, AttemptStatus.SUCCEEDED]
