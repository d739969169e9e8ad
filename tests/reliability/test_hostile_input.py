"""Hostile input against the real SQL stores: PostgreSQL and MariaDB.

Each test plays one thing a careless user, a forged broker message or an
operator editing rows can do, and checks what a user relies on afterwards:
nothing half-written, nothing another run owns touched, a run that cannot go
on failed once (and left alone), and a run that can go on finishing.

Every test builds an engine (:func:`pikku_celery.testing.make_engine`) with the
broker-less :class:`InlineDispatcher` over a :class:`SQLWorkflowStore` on a
scratch database of this module's own (migrated by pikku's migrations), whose
tables are emptied before each test.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import Context, StepFailedError
from pikku_celery.engine import WorkflowEngine
from pikku_celery.engine.execute import call_with
from pikku_celery.errors import InvalidIdError, PayloadError
from pikku_celery.model.values import (
    AttemptState,
    AttemptStatus,
    RunState,
    RunStatus,
    StepState,
    StepStatus,
    step_id_for,
)
from pikku_celery.payload import UnreadableValue
from pikku_celery.sql.schema import step_table
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, Message, make_engine
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG
from tests.store.conftest import migrated_engine, wipe

BACKENDS = ["postgres", "mariadb"]
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000

Snapshot = tuple[RunState | None, list[StepState], list[AttemptState]]


# --- the stores ---------------------------------------------------------------------------
# A scratch database of this module's own: the store suite's ``store_pg_engine`` /
# ``store_mysql_engine`` (tests/store/conftest.py) make ``<session>_store``, and a
# second copy of those fixtures here would drop that database under the store suite
# when the whole test tree runs in one session.


@pytest.fixture(scope="module")
def hostile_pg_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(PG_ADMIN_URL, f"{SESSION_TAG}_hostile")


@pytest.fixture(scope="module")
def hostile_mysql_engine() -> Iterator[sa.Engine]:
    yield from migrated_engine(MYSQL_ADMIN_URL, f"{SESSION_TAG}_hostile")


@pytest.fixture(params=BACKENDS)
def sql_store(request: pytest.FixtureRequest) -> Iterator[SQLWorkflowStore]:
    """A store over empty tables on PostgreSQL or MariaDB."""
    fixture = "hostile_pg_engine" if request.param == "postgres" else "hostile_mysql_engine"
    engine: sa.Engine = request.getfixturevalue(fixture)
    wipe(engine)
    store = store_for(engine)
    yield store
    store.close()  # its settle listener's LISTEN connection, if wait() started one


class World:
    """An engine over a real SQL store, its inline dispatcher, and what bodies did."""

    def __init__(self, store: SQLWorkflowStore, **options: Any) -> None:
        self.store = store
        self.dispatcher = InlineDispatcher()
        self.engine: WorkflowEngine
        self.engine, _ = make_engine(store=store, dispatcher=self.dispatcher, **options)
        self.workflow = self.engine.workflow
        self.task = self.dispatcher.task
        self.ran: list[Any] = []

    def run(self, timeout: float = 30.0) -> int:
        """Deliver every message due within the dispatcher's horizon."""
        return self.dispatcher.run_until_idle(timeout=timeout)

    def snapshot(self, run_id: str) -> Snapshot:
        """Everything the store holds for a run, through its public reads."""
        return (
            self.store.get_run(run_id),
            self.store.get_steps(run_id),
            self.store.get_attempts(run_id),
        )

    def everything(self) -> dict[str, Snapshot]:
        """Every run in the store with its steps and attempts."""
        return {r.id: self.snapshot(r.id) for r in self.store.list_runs(limit=10_000)}

    def run_state(self, run_id: str) -> RunState:
        run = self.store.get_run(run_id)
        assert run is not None, f"run {run_id} does not exist"
        return run

    def steps_by_name(self, run_id: str) -> dict[str, StepState]:
        return {s.name: s for s in self.store.get_steps(run_id)}

    def sent_for(self, run_id: str, kind: str | None = None) -> list[Message]:
        """Messages ever sent for the run (dropped ones included)."""
        return [
            m
            for m in self.dispatcher.sent
            if m.run_id == run_id and (kind is None or m.kind == kind)
        ]

    def operator_sql(self, statement: str, **params: Any) -> int:
        """An operator's hand edit of pikku's rows; returns the rows it changed."""
        with self.store.engine.begin() as conn:
            return int(conn.execute(sa.text(statement), params).rowcount)


def add_task(w: World) -> Any:
    """Register the task ``hostile_add(x) -> x + 1``, which notes every call."""

    @w.task
    def hostile_add(x: int) -> int:
        w.ran.append(x)
        return x + 1

    return hostile_add


class WorkerVanished(BaseException):
    """Raised from a step body: the worker process dies mid-step (no outcome written)."""


def vanish_once(w: World) -> Any:
    """A task whose first call kills its worker mid-step; later calls return "done"."""

    @w.task
    def hostile_fragile() -> str:
        w.ran.append("fragile")
        if len(w.ran) == 1:
            raise WorkerVanished
        return "done"

    return hostile_fragile


def attempts_of(w: World, run_id: str, step_id: str) -> list[tuple[int, AttemptStatus]]:
    return sorted(
        (a.attempt, a.status) for a in w.store.get_attempts(run_id) if a.step_id == step_id
    )


def assert_failed(run: RunState, kind: str) -> str:
    """The run ended failed with an error of type ``kind``: its message."""
    assert run.status == RunStatus.FAILED, run
    found, message = error_of(run)
    assert found == kind, run.error
    return message


def error_of(run: RunState) -> tuple[str, str]:
    assert isinstance(run.error, dict), f"run {run.id} has no readable error: {run.error!r}"
    return str(run.error.get("type")), str(run.error.get("message"))


# --- 1. a step message whose run id and step id do not belong together -------------------


def test_a_step_message_naming_another_run_claims_and_changes_nothing(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.one_step")
    def one_step(ctx: Context, x: int) -> Any:
        return ctx.step("add", hostile_add, x)

    p1 = w.engine.start(one_step, 1).run_id
    p2 = w.engine.start(one_step, 2).run_id
    p1_step = step_id_for(p1, "add")
    before = {r: w.snapshot(r) for r in (p1, p2)}

    for wrong_run in (p2, str(uuid.uuid4())):  # another run's id; a run that exists nowhere
        outcome = w.engine.execute_step(wrong_run, p1_step, "hostile_add", call_with(hostile_add))
        assert outcome is None, f"a message for run {wrong_run} ran step {p1_step} of run {p1}"
    assert w.ran == [], "a step body ran for a mismatched message"
    after = {r: w.snapshot(r) for r in (p1, p2)}
    assert after == before, "a mismatched step message changed rows of P1 or P2"

    w.run()  # the legitimate messages
    assert w.engine.handle(p1).wait(10) == 2
    assert w.engine.handle(p2).wait(10) == 3
    assert attempts_of(w, p1, p1_step) == [(1, AttemptStatus.SUCCEEDED)]
    step = w.store.get_step(p1_step)
    assert step is not None and step.attempt == 1 and step.status == StepStatus.SUCCEEDED


# --- 2. a second step whose name is too long -------------------------------------------------

LONG_NAME = "s" * 300


def test_a_too_long_second_step_name_fails_the_run_once_keeping_the_first_step(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store, message_grace=0.0, idle_after=0.0, sweep_backoff=0.01)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.long_second")
    def long_second(ctx: Context, x: int) -> Any:
        first = ctx.step("first", hostile_add, x)
        return ctx.step(LONG_NAME, hostile_add, first)

    run_id = w.engine.start(long_second, 1).run_id
    w.run()

    run = w.run_state(run_id)
    message = assert_failed(run, "PayloadError")
    assert re.search(r"step name .*300 characters long, above the limit of 255", message), message
    steps = w.store.get_steps(run_id)
    assert [s.name for s in steps] == ["first"], "a step row with the long name exists"
    first = steps[0]
    assert first.status == StepStatus.SUCCEEDED and first.result == 2
    every_attempt = w.store.get_attempts(run_id)
    attempts = [a for a in every_attempt if a.step_id == first.id]
    assert [(a.attempt, a.status, a.result) for a in attempts] == [(1, AttemptStatus.SUCCEEDED, 2)]
    assert w.ran == [1], "the first step ran again"

    # Failed once: later wake-ups and sweeps leave it as it is.
    w.engine.orchestrate(run_id)
    w.engine.sweep()
    w.run()
    assert w.snapshot(run_id) == (run, steps, every_attempt)


# --- 3. names that differ only in trailing spaces -------------------------------------------


def test_idempotency_keys_differing_by_a_trailing_space_start_two_runs(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.echo")
    def echo(ctx: Context, value: Any) -> Any:
        return value

    bare = w.engine.start(echo, {"n": 1}, idempotency_key="padkey")
    padded = w.engine.start(echo, {"n": 2}, idempotency_key="padkey ")
    assert bare.run_id != padded.run_id, "'padkey ' was taken for the run of 'padkey'"
    assert w.run_state(bare.run_id).input == {"n": 1}
    assert w.run_state(padded.run_id).input == {"n": 2}
    assert w.run_state(bare.run_id).idempotency_key == "padkey"
    assert w.run_state(padded.run_id).idempotency_key == "padkey "
    # Each key still finds its own run again.
    assert w.engine.start(echo, {"n": 1}, idempotency_key="padkey").run_id == bare.run_id
    assert w.engine.start(echo, {"n": 2}, idempotency_key="padkey ").run_id == padded.run_id
    w.run()
    assert bare.wait(10) == {"n": 1}
    assert padded.wait(10) == {"n": 2}
    assert len(w.store.list_runs()) == 2


def test_step_names_differing_by_a_trailing_space_are_two_steps(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.padded_steps")
    def padded_steps(ctx: Context, _: Any) -> Any:
        return [ctx.step("a", hostile_add, 1), ctx.step("a ", hostile_add, 10)]

    handle = w.engine.start(padded_steps)
    w.run()
    assert handle.wait(10) == [2, 11]
    steps = w.steps_by_name(handle.run_id)
    assert set(steps) == {"a", "a "}
    assert steps["a"].result == 2 and steps["a "].result == 11
    assert steps["a"].id != steps["a "].id


def test_signals_differing_by_a_trailing_space_are_two_signals(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.padded_signals")
    def padded_signals(ctx: Context, _: Any) -> Any:
        return {"go": ctx.wait_for_signal("go"), "go ": ctx.wait_for_signal("go ")}

    handle = w.engine.start(padded_signals)
    # 'go ' first: were it taken as 'go', the first wait would get its payload.
    w.engine.send_signal(handle.run_id, "go ", "padded")
    w.run()
    run = w.run_state(handle.run_id)
    assert not run.status.terminal, f"the run ended on 'go ' alone: {run.status} {run.output}"
    assert "signal:go " not in w.steps_by_name(handle.run_id)
    w.engine.send_signal(handle.run_id, "go", "bare")
    w.run()
    assert handle.wait(10) == {"go": "bare", "go ": "padded"}


# --- 4. ids that are not UUIDs ------------------------------------------------------------


def digit_prefix(ident: str) -> str | None:
    """The leading digits MariaDB would read from ``ident`` compared with a number."""
    found = re.match(r"\d+", ident)
    return found.group() if found else None


def test_ids_that_are_not_uuids_are_refused_before_any_sql(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.digits")
    def digits(ctx: Context, _: Any) -> Any:
        # A step whose id starts with digits: '4412' must never match it.
        name = next(
            f"n{i}" for i in itertools.count() if digit_prefix(step_id_for(ctx.run_id, f"n{i}"))
        )
        return ctx.step(name, hostile_add, 1)

    handle = None
    for _ in range(64):  # a run whose id starts with digits, too (10 in 16 do)
        handle = w.engine.start(digits)
        if digit_prefix(handle.run_id):
            break
    assert handle is not None
    run_id = handle.run_id
    run_digits = digit_prefix(run_id)
    assert run_digits is not None
    [step] = w.store.get_steps(run_id)
    step_digits = digit_prefix(step.id)
    assert step_digits is not None
    before = w.everything()
    sent = len(w.dispatcher.sent)
    body = call_with(hostile_add)

    hostile_run_ids: list[Any] = [44, "44", int(run_digits), run_digits, f" {run_id}", "", None]
    hostile_step_ids: list[Any] = [44, "44", int(step_digits), step_digits, "", None]
    for bad in hostile_run_ids:
        with pytest.raises(InvalidIdError):
            w.engine.execute_step(bad, step.id, "hostile_add", body)
        with pytest.raises(InvalidIdError):
            w.engine.orchestrate(bad)
    for bad in hostile_step_ids:
        with pytest.raises(InvalidIdError):
            w.engine.execute_step(run_id, bad, "hostile_add", body)

    assert w.ran == [], "a step body ran for a message with a malformed id"
    assert len(w.dispatcher.sent) == sent, "a malformed id made the engine publish"
    assert w.everything() == before, "a malformed id changed a row"

    w.run()
    assert handle.wait(10) == 2
    assert attempts_of(w, run_id, step.id) == [(1, AttemptStatus.SUCCEEDED)]


# --- 5. names no database stores -------------------------------------------------------------

UNSTORABLE = [
    pytest.param("x" * 256, id="256-chars"),
    pytest.param("nul\x00name", id="nul"),
    pytest.param("lone\ud800surrogate", id="lone-surrogate"),
]


@pytest.mark.parametrize("bad", UNSTORABLE)
def test_an_unstorable_step_name_fails_its_run_once_and_the_sweep_leaves_it(
    sql_store: SQLWorkflowStore, bad: str
) -> None:
    w = World(sql_store, message_grace=0.0, idle_after=0.0, sweep_backoff=0.01)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.bad_step")
    def bad_step(ctx: Context, _: Any) -> Any:
        return ctx.step(bad, hostile_add, 1)

    run_id = w.engine.start(bad_step).run_id
    w.run()
    run = w.run_state(run_id)
    message = assert_failed(run, "PayloadError")
    assert "step name" in message, message
    assert w.store.get_steps(run_id) == [], "a step with an unstorable name was written"

    sent = len(w.sent_for(run_id))
    report = w.engine.sweep()
    w.run()
    assert w.sent_for(run_id)[sent:] == [], f"the sweep woke the failed run again: {report}"
    assert w.run_state(run_id).version == run.version
    assert w.ran == []


@pytest.mark.parametrize(
    "bad", [*UNSTORABLE, pytest.param("x" * 249, id="249-chars-with-signal-prefix")]
)
def test_an_unstorable_signal_name_is_refused_with_nothing_written(
    sql_store: SQLWorkflowStore, bad: str
) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.waits")
    def waits(ctx: Context, _: Any) -> Any:
        return ctx.wait_for_signal("ok")

    handle = w.engine.start(waits)
    w.run()
    before = w.snapshot(handle.run_id)
    sent = len(w.dispatcher.sent)
    with pytest.raises(PayloadError, match="signal name"):
        w.engine.send_signal(handle.run_id, bad, {"p": 1})
    assert w.snapshot(handle.run_id) == before, "a refused signal changed the run"
    assert before[0] is not None and w.run_state(handle.run_id).version == before[0].version
    assert len(w.dispatcher.sent) == sent, "a refused signal woke the run"
    # The run is unharmed: the real signal still finishes it.
    w.engine.send_signal(handle.run_id, "ok", "fine")
    w.run()
    assert handle.wait(10) == "fine"


@pytest.mark.parametrize("bad", UNSTORABLE)
def test_an_unstorable_idempotency_key_is_refused_with_no_run_written(
    sql_store: SQLWorkflowStore, bad: str
) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.keyed")
    def keyed(ctx: Context, value: Any) -> Any:
        return value

    with pytest.raises(PayloadError, match="idempotency_key"):
        w.engine.start(keyed, 1, idempotency_key=bad)
    assert w.store.list_runs() == [], "a run was written for an unstorable idempotency key"
    assert w.dispatcher.sent == []


# --- 6. a body that never suspends; cancel while a body runs ------------------------------


def test_a_body_that_never_suspends_fails_its_run_with_default_limits(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.spin")
    def spin(ctx: Context, _: Any) -> Any:
        while True:
            ctx.now()

    run_id = w.engine.start(spin).run_id  # the first pass runs here, and returns
    run = w.run_state(run_id)
    assert_failed(run, "WorkflowLimitError")


@pytest.mark.parametrize(
    ("options", "limit_named"),
    [
        pytest.param(
            {"pass_max_calls": 1000, "pass_max_seconds": 3600},
            "pass_max_calls",
            id="pass_max_calls",
        ),
        pytest.param(
            {"pass_max_seconds": 0.5, "pass_max_calls": 10**12},
            "pass_max_seconds",
            id="pass_max_seconds",
        ),
    ],
)
def test_a_pass_budget_ends_a_spinning_body_that_swallows_exceptions(
    sql_store: SQLWorkflowStore, options: dict[str, Any], limit_named: str
) -> None:
    w = World(sql_store, **options)

    @w.workflow(name="hostile.stubborn_spin")
    def stubborn_spin(ctx: Context, _: Any) -> Any:
        while True:
            with contextlib.suppress(Exception):  # the body swallows every error ctx raises
                ctx.now()

    run_id = w.engine.start(stubborn_spin).run_id  # returns: without the budget it spins on
    run = w.run_state(run_id)
    message = assert_failed(run, "WorkflowLimitError")
    assert limit_named in message, message


def test_cancel_returns_promptly_while_a_slow_body_is_inside_its_pass(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    entered, release = threading.Event(), threading.Event()
    first_pass: list[str] = []

    @w.workflow(name="hostile.slow_pass")
    def slow_pass(ctx: Context, _: Any) -> Any:
        if not first_pass:
            first_pass.append(ctx.run_id)
            entered.set()
            release.wait(60)
        return ctx.wait_for_signal("never")

    failures: list[BaseException] = []

    def starter() -> None:
        try:
            w.engine.start(slow_pass)
        except BaseException as exc:
            failures.append(exc)

    start_thread = threading.Thread(target=starter, daemon=True)
    start_thread.start()
    cancelled = threading.Event()
    try:
        assert entered.wait(15), "the first pass never reached the body"
        run_id = first_pass[0]

        def canceller() -> None:
            try:
                w.engine.cancel(run_id)
            except BaseException as exc:
                failures.append(exc)
            finally:
                cancelled.set()

        threading.Thread(target=canceller, daemon=True).start()
        assert cancelled.wait(30), "engine.cancel blocked while a body was inside its pass"
        # cancel returned while the first pass was still inside the body
        assert start_thread.is_alive()
    finally:
        release.set()
        start_thread.join(30)
    assert not start_thread.is_alive()
    assert failures == []
    w.run()
    assert w.run_state(first_pass[0]).status == RunStatus.CANCELLED


# --- 7. bounds on steps and children; cancel reaches every descendant ---------------------


def test_a_body_recording_steps_in_a_loop_stops_at_max_steps_per_run(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store, max_steps_per_run=5)
    hostile_add = add_task(w)

    @w.workflow(name="hostile.step_loop")
    def step_loop(ctx: Context, _: Any) -> Any:
        for i in itertools.count():
            ctx.step(f"step-{i}", hostile_add, i)

    run_id = w.engine.start(step_loop).run_id
    w.run()
    run = w.run_state(run_id)
    message = assert_failed(run, "WorkflowLimitError")
    assert "max_steps_per_run" in message, message
    # the five steps within the bound ran; the pass past it recorded nothing
    assert [s.name for s in w.store.get_steps(run_id)] == [f"step-{i}" for i in range(5)]
    assert w.ran == [0, 1, 2, 3, 4]


def test_recursive_children_stop_at_max_child_depth(sql_store: SQLWorkflowStore) -> None:
    w = World(sql_store, max_child_depth=2)

    @w.workflow(name="hostile.recurse")
    def recurse(ctx: Context, n: int) -> Any:
        return ctx.child("deeper", "hostile.recurse", n + 1)

    top = w.engine.start(recurse, 0).run_id
    w.run()
    runs = w.store.list_runs(limit=100)
    assert len(runs) == 3, f"recursion made {len(runs)} runs"
    by_depth = {r.depth: r for r in runs}
    assert sorted(by_depth) == [0, 1, 2]
    deepest = by_depth[2]
    message = assert_failed(deepest, "WorkflowLimitError")
    assert "max_child_depth" in message, message
    assert w.run_state(top).status == RunStatus.FAILED
    assert all(r.status == RunStatus.FAILED for r in runs)


def test_a_body_starting_many_children_stops_at_max_children_per_run(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store, max_children_per_run=3)

    @w.workflow(name="hostile.leaf_value")
    def leaf_value(ctx: Context, n: int) -> Any:
        return n

    @w.workflow(name="hostile.many_children")
    def many_children(ctx: Context, _: Any) -> Any:
        return ctx.gather(*(ctx.child_async(f"child-{i}", leaf_value, i) for i in range(10)))

    parent = w.engine.start(many_children).run_id
    w.run()
    run = w.run_state(parent)
    message = assert_failed(run, "WorkflowLimitError")
    assert "max_children_per_run" in message, message
    # the pass that went past the bound kept none of its children
    assert [r.id for r in w.store.list_runs(limit=100)] == [parent]


def test_cancelling_a_parent_reaches_every_descendant(sql_store: SQLWorkflowStore) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.waiting_leaf")
    def waiting_leaf(ctx: Context, _: Any) -> Any:
        return ctx.wait_for_signal("never")

    @w.workflow(name="hostile.middle")
    def middle(ctx: Context, _: Any) -> Any:
        return ctx.child("leaf", waiting_leaf)

    @w.workflow(name="hostile.tree")
    def tree(ctx: Context, _: Any) -> Any:
        return ctx.gather(ctx.child_async("left", middle), ctx.child_async("right", middle))

    top = w.engine.start(tree).run_id
    w.run()
    runs = w.store.list_runs(limit=100)
    assert len(runs) == 5 and not any(r.status.terminal for r in runs)
    w.engine.cancel(top)
    w.run()
    statuses = {r.id: r.status for r in w.store.list_runs(limit=100)}
    assert len(statuses) == 5
    assert set(statuses.values()) == {RunStatus.CANCELLED}, statuses


def test_a_cancelled_parent_starts_no_new_child(sql_store: SQLWorkflowStore) -> None:
    w = World(sql_store)

    @w.workflow(name="hostile.signalled_leaf")
    def signalled_leaf(ctx: Context, _: Any) -> Any:
        return ctx.wait_for_signal("finish")

    @w.workflow(name="hostile.sequence")
    def sequence(ctx: Context, _: Any) -> Any:
        return [ctx.child("c1", signalled_leaf), ctx.child("c2", signalled_leaf)]

    parent = w.engine.start(sequence).run_id
    w.run()
    [child] = [r for r in w.store.list_runs(limit=100) if r.id != parent]
    w.engine.cancel(parent)
    # The child is asked to finish too: its end must not let the parent go on to c2.
    w.engine.send_signal(child.id, "finish", 1)
    w.run()
    runs = w.store.list_runs(limit=100)
    assert {r.id for r in runs} == {parent, child.id}, "a cancelled parent started a child"
    assert w.run_state(parent).status == RunStatus.CANCELLED
    assert w.run_state(child.id).status.terminal
    assert "c2" not in w.steps_by_name(parent)


# --- 8. an operator writes invalid JSON into a step result ----------------------------------


def corrupted_run(w: World) -> str:
    """A run whose first step succeeded, waiting on a signal, with that step's result
    then overwritten by an operator with invalid JSON."""
    hostile_add = add_task(w)

    @w.workflow(name="hostile.corrupted")
    def corrupted(ctx: Context, _: Any) -> Any:
        first = ctx.step("first", hostile_add, 1)
        ctx.wait_for_signal("go")
        return first

    run_id = w.engine.start(corrupted).run_id
    w.run()
    assert w.steps_by_name(run_id)["first"].status == StepStatus.SUCCEEDED
    assert not w.run_state(run_id).status.terminal
    changed = w.operator_sql(
        "UPDATE pikku_workflow_step SET result = '{bad' WHERE run_id = :r AND name = 'first'",
        r=run_id,
    )
    assert changed == 1
    return run_id


def test_an_invalid_json_step_result_fails_the_next_pass_once_naming_it(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    run_id = corrupted_run(w)

    steps = w.store.get_steps(run_id)  # must not raise
    [first] = [s for s in steps if s.name == "first"]
    assert isinstance(first.result, UnreadableValue), first.result
    assert first.result.text == "{bad"

    w.engine.orchestrate(run_id)
    run = w.run_state(run_id)
    message = assert_failed(run, "CorruptValueError")
    assert run_id in message and "'first'" in message and "result" in message, message

    # Once: more wake-ups leave the failed run alone.
    w.engine.orchestrate(run_id)
    w.run()
    assert w.run_state(run_id).version == run.version
    assert w.run_state(run_id).error == run.error


def test_a_run_with_an_invalid_json_step_result_can_be_cancelled(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    run_id = corrupted_run(w)
    w.engine.cancel(run_id)  # before any pass has read the bad value
    w.run()
    assert w.run_state(run_id).status == RunStatus.CANCELLED


# --- 9. a lease set far ahead by hand; cancel of a running step -----------------------------


def running_step_without_worker(w: World, retries: int) -> tuple[str, str]:
    """A run whose only step is running, its worker gone mid-body; (run id, step id)."""
    fragile = vanish_once(w)

    @w.workflow(name="hostile.fragile")
    def fragile_run(ctx: Context, _: Any) -> Any:
        return ctx.step("fragile", fragile, retries=retries)

    run_id = w.engine.start(fragile_run).run_id
    with pytest.raises(WorkerVanished):
        w.run()
    step_id = step_id_for(run_id, "fragile")
    step = w.store.get_step(step_id)
    assert step is not None and step.status == StepStatus.RUNNING and step.attempt == 1
    return run_id, step_id


def test_a_lease_set_ten_years_ahead_counts_as_lapsed(sql_store: SQLWorkflowStore) -> None:
    w = World(sql_store)
    run_id, step_id = running_step_without_worker(w, retries=1)
    far = w.store.now_ms() + TEN_YEARS_MS
    changed = w.operator_sql(
        "UPDATE pikku_workflow_step SET lease_expires_at = :far WHERE id = :s", far=far, s=step_id
    )
    assert changed == 1

    sent = len(w.sent_for(run_id, "step"))
    report = w.engine.sweep()
    assert report.requeued_lapsed == 1, f"the sweep did not take the step as lapsed: {report}"
    resent = w.sent_for(run_id, "step")[sent:]
    assert [m.step_id for m in resent] == [step_id]

    w.run()
    assert w.engine.handle(run_id).wait(10) == "done"
    assert attempts_of(w, run_id, step_id) == [
        (1, AttemptStatus.SUPERSEDED),
        (2, AttemptStatus.SUCCEEDED),
    ]


def test_cancel_of_a_run_with_a_running_step_leaves_nothing_running(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)
    run_id, step_id = running_step_without_worker(w, retries=0)
    w.engine.cancel(run_id)
    w.run()
    assert w.run_state(run_id).status == RunStatus.CANCELLED
    steps = w.store.get_steps(run_id)
    attempts = w.store.get_attempts(run_id)
    assert [s.name for s in steps if s.status == StepStatus.RUNNING] == []
    assert [a.attempt for a in attempts if a.status == AttemptStatus.RUNNING] == []
    assert [(a.attempt, a.status) for a in attempts] == [(1, AttemptStatus.CANCELLED)]
    [step] = steps
    assert step.id == step_id and step.status == StepStatus.FAILED
    assert isinstance(step.error, dict) and step.error.get("type") == "WorkflowCancelledError"


# --- 11/12. the sweep's backoff; an early message for a retry ---------------------------------

BASE_MS, CAP_MS = 50, 400


def test_the_sweep_backs_off_resending_a_step_whose_message_is_always_lost(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(
        sql_store,
        sweep_backoff=BASE_MS / 1000,
        sweep_max_backoff=CAP_MS / 1000,
        message_grace=0.01,
    )
    hostile_add = add_task(w)

    def lose_steps(message: Message) -> bool:
        return message.kind == "step"

    w.dispatcher.drop = lose_steps

    @w.workflow(name="hostile.lost")
    def lost(ctx: Context, _: Any) -> Any:
        return ctx.step("lost", hostile_add, 1)

    run_id = w.engine.start(lost).run_id
    assert len(w.sent_for(run_id, "step")) == 1  # sent and lost

    # Each sweep is bracketed by the store's own clock, the clock its backoff
    # is written on: the backoff it set lies exactly within the bracket.
    resends: list[tuple[int, int, int, int]] = []  # (sweep_count, before, after, next sweep)
    deadline = time.monotonic() + 30
    while len(resends) < 6:
        assert time.monotonic() < deadline, f"only {len(resends)} re-sends: {resends}"
        before = w.store.now_ms()
        report = w.engine.sweep()
        after = w.store.now_ms()
        if not report.resent:
            time.sleep(0.005)  # the polling interval of this loop
            continue
        # the backoff is the step's own (a run's other steps are not held back)
        with sql_store.engine.connect() as conn:
            count, due = conn.execute(
                sa.select(step_table.c.sweep_count, step_table.c.next_sweep_at).where(
                    step_table.c.id == step_id_for(run_id, "lost")
                )
            ).one()
        resends.append((count, before, after, due))
    assert len(w.sent_for(run_id, "step")) == 1 + len(resends)
    assert w.ran == []

    for k, (count, before, after, due) in enumerate(resends, 1):
        want = min(BASE_MS * 2 ** (k - 1), CAP_MS)  # doubling, up to the cap
        assert count == k, f"sweep_count does not grow: {resends}"
        assert before + want - 1 <= due <= after + want + 1, f"backoff is not {want} ms: {resends}"
    # never re-sent before the backoff the previous re-send set had run out
    for (*_, due), (_, _, after, _) in itertools.pairwise(resends):
        assert after >= due - 1, f"re-sent sooner than the backoff: {resends}"


def test_a_step_message_arriving_during_its_retry_delay_is_dropped(
    sql_store: SQLWorkflowStore,
) -> None:
    w = World(sql_store)

    @w.task
    def hostile_flaky() -> str:
        w.ran.append("flaky")
        if len(w.ran) == 1:
            raise ValueError("the first attempt fails")
        return "ok"

    @w.workflow(name="hostile.flaky")
    def flaky(ctx: Context, _: Any) -> Any:
        return ctx.step("flaky", hostile_flaky, retries=2, retry_delay=30)

    run_id = w.engine.start(flaky).run_id
    w.run()  # the first attempt fails; its retry's message is 30 s out and stays queued
    step_id = step_id_for(run_id, "flaky")
    waiting = w.store.get_step(step_id)
    assert waiting is not None
    assert waiting.status == StepStatus.FAILED and waiting.wake_at is not None
    assert waiting.attempt == 1
    sent = len(w.dispatcher.sent)
    before = w.snapshot(run_id)

    outcome = w.engine.execute_step(run_id, step_id, "hostile_flaky", call_with(hostile_flaky))
    assert outcome is None, "an early message ran a step waiting for its retry delay"
    assert w.ran == ["flaky"]
    assert w.dispatcher.sent[sent:] == [], "the early message made the worker publish"
    assert w.snapshot(run_id) == before


# --- a result too large for the database -------------------------------------------------


def test_a_result_larger_than_the_database_takes_fails_its_step_naming_the_limit(
    hostile_mysql_engine: sa.Engine,
) -> None:
    """MariaDB refuses a statement over ``max_allowed_packet`` by closing the
    connection ("server has gone away"), which used to be waited out as an
    outage for the whole retry window, the step left running. Now the result
    is refused at the step: the step fails at once, naming the size and the limit."""
    wipe(hostile_mysql_engine)
    w = World(store_for(hostile_mysql_engine), outcome_retry=5.0)
    with hostile_mysql_engine.connect() as conn:
        packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())

    @w.task
    def huge() -> str:
        return "x" * (packet // 2 + 1)  # twice in a pass: one packet cannot carry it

    @w.workflow
    def wf(ctx: Context) -> str:
        try:
            return str(ctx.step("huge", huge, retries=2))
        except StepFailedError as exc:
            return str(exc)

    run = wf.start()
    w.run(timeout=60)
    message = run.wait(timeout=5)
    assert f"result is {packet // 2 + 3} bytes of JSON, above the limit of" in message
    assert f"max_allowed_packet of {packet} bytes" in message
    step = w.steps_by_name(run.run_id)["huge"]
    assert step.status == StepStatus.FAILED and step.attempt == 1
