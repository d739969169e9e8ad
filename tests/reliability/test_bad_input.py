"""The bad-input catalogue: one row per bad input, the exact error a user gets.

Every row builds the same small world first (a SQLite store holding a
completed run, a live run whose step is in flight, and a stored signal), then
provokes one bad input and checks three things:

* the exact exception type the user sees, raised at the boundary or, where
  the input arrives as a message, logged at ERROR by the worker that refused it;
* the message fragments that tell the user what was wrong (a path, a name,
  a command to run), and never a database password;
* that everything already stored is unchanged: every row of every pikku table
  (plus whatever else the row watches), no task body ran, nothing was sent.

Rows whose input is only detected while a run replays (an unknown task, a step
name used twice) fail that one new run with the error recorded on it; that run
must hold no step, and everything else must be unchanged.
"""

from __future__ import annotations

import logging
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.app.defaults import DEFAULTS as CELERY_DEFAULTS
from celery.signals import task_postrun
from kombu.exceptions import ContentDisallowed

from pikku_celery import Context, Pikku
from pikku_celery.celery.dispatcher import ORCHESTRATE, RUN_STEP
from pikku_celery.engine import WorkflowEngine
from pikku_celery.errors import (
    InvalidRunIdError,
    PayloadError,
    RunNotFoundError,
    RunSettledError,
    SchemaMissingError,
    StoreError,
    StoreUnavailableError,
    UnknownWorkflowError,
    WorkflowFailedError,
    WorkflowStepFunctionMismatchError,
)
from pikku_celery.model.values import StepState, StepStatus
from pikku_celery.sql.schema import metadata
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import memory_broker_config, wait_until
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

SECRET = "s3cr3t"
MAX_INPUT = 2_000
QUEUE = f"pikku-bad-input-{uuid.uuid4().hex[:8]}"


# --- the Celery in-process worker (memory broker) ------------------------------------


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return memory_broker_config(QUEUE)


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": (QUEUE,), "perform_ping_check": False}


@pytest.fixture(scope="module")
def empty_pg_url() -> Iterator[str]:
    """A PostgreSQL database without pikku's tables; the URL carries a password
    (the server trusts loopback, so it is never checked, only shown or not)."""
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_empty") as url:
        yield sa.make_url(url).set(password=SECRET).render_as_string(hide_password=False)


# --- a pickle that records being unpickled ---------------------------------------------

UNPICKLED: list[str] = []


def _unpickle(value: str) -> str:
    UNPICKLED.append(value)
    return value


class Tripwire:
    """Unpickles as ``value``, leaving a trace: proof that pickle was loaded."""

    def __init__(self, value: str) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Callable[[str], str], tuple[str]]:
        return _unpickle, (self.value,)


# --- the world every row starts from --------------------------------------------------


def install_workflows(engine: WorkflowEngine) -> None:
    """The world's workflows; their steps name the task ``bad.charge``."""

    @engine.workflow(name="bad.order")
    def order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
        return {"charge": ctx.step("charge", "bad.charge", order["id"])}

    @engine.workflow(name="bad.fanout")
    def fanout(ctx: Context, order: dict[str, Any]) -> list[Any]:
        # The classic slip: one name for every step of a fan-out.
        return ctx.gather(*(ctx.step_async("charge", "bad.charge", i) for i in order["ids"]))


class World:
    """A SQLite store with a completed run, a live run and a stored signal."""

    def __init__(self, sql_engine: sa.Engine, request: pytest.FixtureRequest) -> None:
        self.sql_engine = sql_engine
        self.request = request
        metadata.create_all(sql_engine)
        self.store = store_for(sql_engine, create_tables=False)
        engine, dispatcher = make_engine(self.store, max_input_bytes=MAX_INPUT)
        self.engine: WorkflowEngine = engine
        self.dispatcher: InlineDispatcher = dispatcher
        self.calls: list[str] = []
        self.watched: list[Callable[[], object]] = []
        self._install()
        done = self.engine.start("bad.order", {"id": 1})
        self.dispatcher.run_until_idle()
        assert done.result() == {"charge": "charged 1"}
        live = self.engine.start("bad.order", {"id": 2}, idempotency_key="order-2")
        self.engine.send_signal(live.run_id, "note", {"by": "clerk"})
        self.dispatcher.messages.clear()  # the step's message is still on its way
        self.done = done.run_id
        self.live = live.run_id
        [step] = self.store.get_steps(self.live)
        assert step.status == StepStatus.SCHEDULED
        self.live_step = step.id
        self.calls.clear()
        self.sent = len(self.dispatcher.sent)

    def _install(self) -> None:
        @self.dispatcher.task(name="bad.charge")
        def charge(order_id: int) -> str:
            self.calls.append(f"bad.charge({order_id})")
            return f"charged {order_id}"

        install_workflows(self.engine)

    def ids(self) -> dict[str, str]:
        return {"done": self.done, "live": self.live, "step": self.live_step}

    def pikku(self, app: Celery | None = None, **options: Any) -> Pikku:
        """A Pikku on the same store, on ``app`` or a broker-less app of its own."""
        if app is None:
            app = Celery("bad-input", broker="memory://", set_as_current=False)
            app.conf.task_default_queue = f"{QUEUE}-unconsumed"
        return Pikku(app, engine=self.sql_engine, store=self.store, install_beat=False, **options)

    def snapshot(self, exclude_runs: frozenset[str] = frozenset()) -> dict[str, Any]:
        """Every row of every pikku table (but those of ``exclude_runs``), and
        whatever the row asked to watch."""
        tables: dict[str, list[dict[str, Any]]] = {}
        with self.sql_engine.connect() as conn:
            for table in metadata.sorted_tables:
                query = sa.select(table).order_by(*table.primary_key.columns)
                tables[table.name] = [
                    dict(row)
                    for row in conn.execute(query).mappings()
                    if row.get("run_id", row.get("id")) not in exclude_runs
                ]
        return {"tables": tables, "watched": [watch() for watch in self.watched]}


@pytest.fixture
def world(sqlite_engine: sa.Engine, request: pytest.FixtureRequest) -> World:
    UNPICKLED.clear()
    return World(sqlite_engine, request)


# --- the rows -------------------------------------------------------------------------

Provoke = Callable[[], object]


@dataclass(frozen=True)
class Row:
    prepare: Callable[[World], Provoke]  # set up what the row needs; return the bad call
    error: type[BaseException]  # the exact type the user sees
    fragments: tuple[str, ...]  # in its message; formatted with World.ids()
    seen: Literal["raised", "logged"] = "raised"
    recorded: str | None = None  # a run failure: the error type recorded on the run


def call(fn: Callable[[WorkflowEngine], object]) -> Callable[[World], Provoke]:
    """A row that is one call on the world's engine."""
    return lambda w: lambda: fn(w.engine)


def unknown_task(w: World) -> Provoke:
    pikku = w.pikku()

    @pikku.workflow(name="bad.pack")
    def pack(ctx: Context, order: dict[str, Any]) -> Any:
        return ctx.step("pack", "bad.no_such_task", order["id"])

    return lambda: pikku.start("bad.pack", {"id": 5}).result()


def first_use(url: str) -> Any:
    """A Pikku on ``url`` is built without touching it; its first use says what is wrong."""
    pikku = Pikku(Celery("bad-input", set_as_current=False), database_url=url)
    return pikku.store.list_runs()


def database_url(url: str) -> Callable[[World], Provoke]:
    return lambda w: lambda: first_use(url)


def missing_tables(w: World) -> Provoke:
    url = w.request.getfixturevalue("empty_pg_url")
    probe = sa.create_engine(url, poolclass=sa.pool.NullPool)

    def tables() -> list[str]:
        return sorted(sa.inspect(probe).get_table_names())

    assert tables() == []
    w.watched.append(tables)
    return lambda: first_use(url)


def pickle_message(w: World) -> Provoke:
    app: Celery = w.request.getfixturevalue("celery_app")
    assert set(app.conf.accept_content) == set(CELERY_DEFAULTS["accept_content"]) == {"json"}
    install_workflows(w.pikku(app, queue_leases={QUEUE: 30}))

    @app.task(name="bad.charge", shared=False)
    def charge(order_id: int) -> str:
        w.calls.append(f"celery bad.charge({order_id})")
        return f"charged {order_id}"

    w.request.getfixturevalue("celery_worker")  # after every task is registered

    def publish() -> None:
        # A well-formed run_step for the live step, as pickle: were it loaded,
        # the tripwire would fire and the worker would claim and run the step.
        args = (w.live, w.live_step, 1, Tripwire("bad.charge"), QUEUE)
        message = app.amqp.as_task_v2(str(uuid.uuid4()), RUN_STEP, args=args, kwargs={})
        queue = app.amqp.queues[QUEUE]
        with app.producer_or_acquire() as producer:
            producer.publish(
                message.body,
                serializer="pickle",
                headers=message.headers,
                exchange=queue.exchange,
                routing_key=queue.routing_key,
                declare=[queue],
                **message.properties,
            )
        # Then a harmless JSON message behind it (a wake-up of the settled run,
        # which returns at once): once it has run, the worker (solo pool, one
        # queue, in order) has dealt with the pickle, whatever it did with it.
        probe = str(uuid.uuid4())
        finished: set[str] = set()

        def on_postrun(task_id: str | None = None, **_: Any) -> None:
            finished.add(str(task_id))

        task_postrun.connect(on_postrun, weak=False)
        try:
            app.send_task(ORCHESTRATE, args=(w.done, "probe"), queue=QUEUE, task_id=probe)
            wait_until(lambda: probe in finished, timeout=15)
        finally:
            task_postrun.disconnect(on_postrun)

    return publish


def other_task_name(w: World) -> Provoke:
    def body(step: StepState) -> Any:
        w.calls.append(f"body of {step.name}")
        return "ran"

    def provoke() -> object:
        result = w.engine.execute_step(w.live, w.live_step, "bad.other", body)
        assert result is None
        return result

    return provoke


ROWS = [
    pytest.param(
        Row(
            call(lambda e: e.start("bad.no_such_workflow", {"id": 3})),
            UnknownWorkflowError,
            ("no workflow is registered as 'bad.no_such_workflow'", "registered: bad.fanout"),
        ),
        id="unknown-workflow-at-start",
    ),
    pytest.param(
        Row(
            unknown_task,
            WorkflowFailedError,
            ("UnknownTaskError: task 'bad.no_such_task' is not registered with Celery app",),
            recorded="UnknownTaskError",
        ),
        id="unknown-task-in-a-step",
    ),
    pytest.param(
        Row(
            call(lambda e: e.start("bad.order", {"order": {"id": 4, "when": datetime.now(UTC)}})),
            PayloadError,
            ("workflow 'bad.order': input['order']['when'] is a datetime, which is not JSON",),
        ),
        id="non-json-input-nested",
    ),
    pytest.param(
        Row(
            call(lambda e: e.start("bad.order", {"id": 6, "blob": "x" * MAX_INPUT})),
            PayloadError,
            ("workflow 'bad.order': input is", f"bytes of JSON, above the limit of {MAX_INPUT}"),
        ),
        id="input-above-max-input-bytes",
    ),
    pytest.param(
        Row(
            call(lambda e: e.handle("not-a-run-id")),
            InvalidRunIdError,
            ("'not-a-run-id' is not a workflow run id (a UUID)",),
        ),
        id="malformed-run-id-handle",
    ),
    pytest.param(
        Row(
            call(lambda e: e.send_signal("42", "note", {"by": "x"})),
            InvalidRunIdError,
            ("'42' is not a workflow run id (a UUID)",),
        ),
        id="malformed-run-id-send-signal",
    ),
    pytest.param(
        Row(
            call(lambda e: e.cancel("'; DELETE FROM pikku_workflow_run; --")),
            InvalidRunIdError,
            ('"\'; DELETE FROM pikku_workflow_run; --" is not a workflow run id (a UUID)',),
        ),
        id="malformed-run-id-cancel",
    ),
    pytest.param(
        Row(
            call(lambda e: e.send_signal(str(uuid.UUID(int=7)), "note", {"by": "x"})),
            RunNotFoundError,
            (f"no workflow run '{uuid.UUID(int=7)}'",),
        ),
        id="signal-to-unknown-run",
    ),
    pytest.param(
        Row(
            call(lambda e: e.start("bad.fanout", {"ids": [7, 8]}).result()),
            WorkflowFailedError,
            (
                "WorkflowNondeterminismError: step name 'charge' is used twice in run",
                "(as step #0 and step #1, numbered from 0 as in runs show); step names must be "
                "unique within a run",
            ),
            recorded="WorkflowNondeterminismError",
        ),
        id="duplicate-step-name",
    ),
    pytest.param(
        Row(
            lambda w: lambda: w.engine.send_signal(w.done, "note", {"by": "x"}),
            RunSettledError,
            ("workflow run {done} is completed; it takes no signals",),
        ),
        id="signal-to-finished-run",
    ),
    pytest.param(
        Row(
            lambda w: lambda: w.engine.cancel(w.done),
            RunSettledError,
            ("workflow run {done} is already completed",),
        ),
        id="cancel-of-finished-run",
    ),
    pytest.param(
        Row(
            database_url(f"postgresq://pikku:{SECRET}@127.0.0.1/shop"),
            StoreError,
            ("postgresq://pikku:***@127.0.0.1/shop", "postgresq"),
        ),
        id="wrong-database-url-unknown-dialect",
    ),
    pytest.param(
        Row(
            database_url(f"postgresql+psycopg://pikku:{SECRET}@127.0.0.1:1/shop"),
            StoreUnavailableError,
            ("postgresql+psycopg://pikku:***@127.0.0.1:1/shop", "Connection refused"),
        ),
        id="wrong-database-url-closed-port",
    ),
    pytest.param(
        Row(
            missing_tables,
            SchemaMissingError,
            (
                "table pikku_workflow_run is missing",
                "Create or upgrade them with: pikku-celery db upgrade --database-url "
                "'postgresql+psycopg://postgres:***@127.0.0.1",
            ),
        ),
        id="missing-tables-postgresql",
    ),
    pytest.param(
        Row(
            pickle_message,
            ContentDisallowed,
            (
                "Received invalid task message: Refusing to deserialize untrusted content "
                "of type pickle",
            ),
            seen="logged",
        ),
        id="pickle-message-to-a-pikku-queue",
    ),
    pytest.param(
        Row(
            other_task_name,
            WorkflowStepFunctionMismatchError,
            (
                "refused a step message: step {step} was recorded for task 'bad.charge' "
                "but the message names 'bad.other'",
            ),
            seen="logged",
        ),
        id="step-message-naming-another-task",
    ),
]


def logged_error(records: list[logging.LogRecord]) -> tuple[BaseException, str] | None:
    """The first exception logged at ERROR or above, and the line logged with it."""
    for record in records:
        if record.levelno < logging.ERROR:
            continue
        args = record.args if isinstance(record.args, tuple) else ()
        found = [a for a in args if isinstance(a, BaseException)]
        if record.exc_info and record.exc_info[1] is not None:
            found.append(record.exc_info[1])
        if found:
            return found[0], record.getMessage()
    return None


@pytest.mark.parametrize("row", ROWS)
def test_bad_input_gets_a_clear_error_and_changes_nothing(
    row: Row, world: World, caplog: pytest.LogCaptureFixture
) -> None:
    provoke = row.prepare(world)
    before = world.snapshot()
    caplog.set_level(logging.INFO)

    if row.seen == "raised":
        with pytest.raises(row.error) as info:
            provoke()
        error: BaseException = info.value
        message = str(error)
    else:
        assert provoke() is None
        found = logged_error(caplog.records)
        assert found is not None, f"nothing was logged at ERROR; the log:\n{caplog.text}"
        error, message = found

    # The exact error, and what it tells the user.
    assert type(error) is row.error, f"{type(error).__name__}: {error}"
    for fragment in row.fragments:
        assert fragment.format(**world.ids()) in message
    shown = message + "".join(traceback.format_exception(error)) + caplog.text
    assert SECRET not in shown

    # Nothing already stored changed; nothing ran; nothing was sent.
    new_runs: frozenset[str] = frozenset()
    if row.recorded is not None:
        assert isinstance(error, WorkflowFailedError)
        assert error.error["type"] == row.recorded
        new_runs = frozenset({error.run_id})
        assert world.store.get_steps(error.run_id) == []
        assert world.store.get_attempts(error.run_id) == []
    assert world.snapshot(exclude_runs=new_runs) == before
    assert world.calls == []
    assert UNPICKLED == []
    assert world.dispatcher.sent[world.sent :] == []
