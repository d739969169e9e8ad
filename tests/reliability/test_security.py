"""Security review: what a message can make a worker do, and what is shown.

* pikku's own tasks are JSON-only (registered and sent with the JSON serializer);
* a message runs only registered workflows and tasks, and only the task that
  was recorded for the step it names;
* names that arrive in messages (workflow, task, step, signal, idempotency
  key) travel to SQL as bound parameters, never as SQL text;
* database passwords never appear in errors, logs or CLI output.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery
from celery.signals import task_postrun, task_unknown
from click.testing import CliRunner

from pikku_celery import Context, Pikku
from pikku_celery.celery.dispatcher import ORCHESTRATE, RUN_STEP, SWEEP
from pikku_celery.celery.integration import BEAT_ENTRY
from pikku_celery.celery.retention import PRUNE
from pikku_celery.cli import main as cli
from pikku_celery.engine import WorkflowEngine
from pikku_celery.errors import (
    IdempotencyKeyReusedError,
    SchemaMissingError,
    UnknownWorkflowError,
    WorkflowStepFunctionMismatchError,
)
from pikku_celery.model.values import StepState, StepStatus
from pikku_celery.sql.schema import STORE_TABLES, metadata
from pikku_celery.store import InMemoryWorkflowStore
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import memory_broker_config, wait_until
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

SECRET = "s3cr3t"
QUEUE = f"pikku-security-{uuid.uuid4().hex[:8]}"


def sql_store(engine: sa.Engine) -> SQLWorkflowStore:
    metadata.create_all(engine)
    return store_for(engine, create_tables=False)


def shown(exc: BaseException) -> str:
    """Everything a traceback of ``exc`` shows, chained causes included."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


# --- pikku's tasks are JSON only ---------------------------------------------------------


def test_pikku_tasks_are_registered_and_sent_as_json_only() -> None:
    app = Celery("security", broker="memory://", set_as_current=False)
    app.conf.task_serializer = "pickle"  # an app default pikku must not inherit
    steps_queue, wake_queue = f"{QUEUE}-steps", f"{QUEUE}-wake"
    pikku = Pikku(app, store=InMemoryWorkflowStore(), orchestration_queue=wake_queue)

    for name in (RUN_STEP, ORCHESTRATE, SWEEP, PRUNE):
        assert app.tasks[name].serializer == "json", name
    assert app.conf.beat_schedule[BEAT_ENTRY]["options"]["serializer"] == "json"
    assert list(app.conf.accept_content) == ["json"]

    @app.task(name="security.echo", shared=False)
    def echo(text: str) -> str:
        return text

    @pikku.workflow(name="security.flow")
    def flow(ctx: Context, text: str) -> Any:
        return ctx.step("echo", echo, text, queue=steps_queue)

    run = pikku.start("security.flow", "hello")  # sends the step's run_step message
    run.cancel()  # sends an orchestrate wake-up

    with app.connection_for_read() as conn:
        for queue, task in ((steps_queue, RUN_STEP), (wake_queue, ORCHESTRATE)):
            with conn.SimpleQueue(queue, no_ack=True) as q:
                message = q.get(timeout=5)
                assert message.headers["task"] == task
                assert message.content_type == "application/json"
                assert message.decode()[0][0] == run.run_id  # args: run id first


def test_an_app_that_accepts_pickle_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("security", broker="memory://", set_as_current=False)
    app.conf.accept_content = ["json", "pickle"]
    with caplog.at_level(logging.WARNING, logger="pikku_celery"):
        Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)
    assert "accepts pickle" in caplog.text
    assert "accept_content=['json']" in caplog.text


# --- messages run only registered workflows and tasks ------------------------------------


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return memory_broker_config(QUEUE)


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": (QUEUE,), "perform_ping_check": False}


class Deployment:
    """Runs recorded by one deployment (an inline engine that knows every
    task and workflow), served by a Celery worker whose app knows fewer."""

    def __init__(self, sql_engine: sa.Engine, request: pytest.FixtureRequest) -> None:
        self.sql_engine = sql_engine
        self.store = sql_store(sql_engine)
        self.calls: list[str] = []
        engine, dispatcher = make_engine(self.store)
        self.recorder: WorkflowEngine = engine
        self.recorder_dispatcher: InlineDispatcher = dispatcher
        for name in ("security.charge", "security.elsewhere"):
            dispatcher.task(self._recording(name), name=name)
        self._workflows(engine, "security.flow", "security.charge")
        self._workflows(engine, "security.flow_elsewhere", "security.elsewhere")
        self._workflows(engine, "security.unregistered_flow", "security.charge")

        # Each run's step is recorded and its message dropped: in flight.
        self.live = self._start("security.flow")
        self.elsewhere = self._start("security.flow_elsewhere")
        self.unregistered = self._start("security.unregistered_flow")

        # The worker: knows security.charge but not security.elsewhere, and
        # not the workflow security.unregistered_flow.
        self.app: Celery = request.getfixturevalue("celery_app")
        self.pikku = Pikku(self.app, engine=sql_engine, store=self.store, install_beat=False)
        self.app.task(name="security.charge", shared=False)(self._recording("celery charge"))
        self._workflows(self.pikku, "security.flow", "security.charge")
        self._workflows(self.pikku, "security.flow_elsewhere", "security.elsewhere")
        request.getfixturevalue("celery_worker")
        self.finished: set[str] = set()
        self.unknown: set[str] = set()

    def _recording(self, name: str) -> Callable[..., str]:
        def body(*args: Any) -> str:
            self.calls.append(f"{name}{args}")
            return "ran"

        return body

    @staticmethod
    def _workflows(engine: WorkflowEngine, name: str, task: str) -> None:
        @engine.workflow(name=name)
        def flow(ctx: Context, order: dict[str, Any]) -> Any:
            return ctx.step("charge", task, order["id"])

    def _start(self, workflow: str) -> StepState:
        run = self.recorder.start(workflow, {"id": 1})
        self.recorder_dispatcher.messages.clear()
        [step] = self.store.get_steps(run.run_id)
        assert step.status == StepStatus.SCHEDULED
        return step

    def rows(self) -> dict[str, list[dict[str, Any]]]:
        with self.sql_engine.connect() as conn:
            return {
                t.name: [dict(r) for r in conn.execute(sa.select(t)).mappings()]
                for t in STORE_TABLES
            }

    def send(self, task: str, *args: Any) -> None:
        """Send a JSON message and wait until the worker has dealt with it."""
        task_id = str(uuid.uuid4())
        self.app.send_task(task, args=args, queue=QUEUE, task_id=task_id, serializer="json")
        wait_until(lambda: task_id in self.finished or task_id in self.unknown, timeout=15)


@pytest.fixture
def deployment(
    sqlite_engine: sa.Engine, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    system_calls: list[str] = []

    def system(command: str) -> int:
        system_calls.append(command)
        return 0

    monkeypatch.setattr(os, "system", system)
    d = Deployment(sqlite_engine, request)

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        d.finished.add(str(task_id))

    def on_unknown(id: str | None = None, **_: Any) -> None:
        d.unknown.add(str(id))

    task_postrun.connect(on_postrun, weak=False)
    task_unknown.connect(on_unknown, weak=False)
    try:
        yield d
    finally:
        task_postrun.disconnect(on_postrun)
        task_unknown.disconnect(on_unknown)
    assert system_calls == []


def test_a_step_message_runs_only_the_task_recorded_for_its_step(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    d = deployment
    before = d.rows()
    live = d.live
    caplog.set_level(logging.INFO)

    # A real step, another task name: refused before any claim.
    d.send(RUN_STEP, live.run_id, live.id, 1, "os.system", QUEUE)
    # A step that does not exist, naming a task the app does not have.
    d.send(RUN_STEP, str(uuid.uuid4()), str(uuid.uuid4()), 1, "os.system", QUEUE)
    # Not a pikku task at all: Celery refuses a task it does not know.
    d.send("os.system", "touch /tmp/pwned")

    assert d.calls == []
    assert d.rows() == before
    refusals = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and isinstance(r.args, tuple)
        and any(isinstance(a, WorkflowStepFunctionMismatchError) for a in r.args)
    ]
    assert len(refusals) == 1, caplog.text
    assert "but the message names 'os.system'" in caplog.text
    assert "names task 'os.system', which this worker's Celery app does not have" in caplog.text
    assert "Received unregistered task of type 'os.system'" in caplog.text


def test_a_step_whose_task_this_worker_lacks_is_left_unclaimed(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    d = deployment
    step = d.elsewhere
    before = d.rows()
    d.send(RUN_STEP, step.run_id, step.id, 1, "security.elsewhere", QUEUE)

    # Not claimed, so no attempt is spent: a worker that has the task (during a
    # rolling deploy), or the sweep's re-send, takes it later.
    assert d.calls == []
    assert d.rows() == before
    assert d.store.get_attempts(step.run_id) == []
    assert "names task 'security.elsewhere', which this worker's Celery app does not have" in (
        caplog.text
    )


def test_a_wake_up_of_a_run_of_an_unregistered_workflow_only_marks_it_blocked(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    """No pass can run it here (a worker of a newer deploy may know the
    workflow): the run is left as it was, but says why it is not moving."""
    d = deployment
    before = d.rows()
    d.send(ORCHESTRATE, d.unregistered.run_id, "forged")
    after = d.rows()
    [blocked] = [r for r in after["pikku_workflow_run"] if r["id"] == d.unregistered.run_id]
    assert "no workflow is registered as 'security.unregistered_flow'" in blocked["blocked"]
    for row in after["pikku_workflow_run"]:
        row["blocked"] = None
    assert after == before
    assert d.calls == []
    assert "no workflow is registered as 'security.unregistered_flow'" in caplog.text
    assert UnknownWorkflowError.__name__ in caplog.text


# --- names from messages are never SQL text -------------------------------------------------

EVIL_WORKFLOW = "x'); DROP TABLE pikku_workflow_run; --"
EVIL_TASK = 'x"); DROP TABLE pikku_workflow_step; --'
EVIL_STEP = "x'; DROP TABLE pikku_workflow_step_attempt; --"
EVIL_SIGNAL = "x'); DELETE FROM pikku_workflow_signal; --"
EVIL_KEY = "x' OR '1'='1"
EVIL = (EVIL_WORKFLOW, EVIL_TASK, EVIL_STEP, EVIL_SIGNAL, EVIL_KEY)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_names_from_messages_are_bound_parameters_never_sql(
    dialect: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    sql_engine: sa.Engine = request.getfixturevalue(
        "sqlite_engine" if dialect == "sqlite" else "postgres_engine"
    )
    store = sql_store(sql_engine)
    engine, dispatcher = make_engine(store)
    statements: list[str] = []
    parameters: list[str] = []

    def capture(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        statements.append(statement)
        parameters.append(repr(params))

    @dispatcher.task(name=EVIL_TASK)
    def evil_task(value: str) -> str:
        return value

    @engine.workflow(name=EVIL_WORKFLOW)
    def evil_flow(ctx: Context, data: dict[str, Any]) -> dict[str, Any]:
        result = ctx.step(EVIL_STEP, EVIL_TASK, data[EVIL_STEP])
        return {"step": result, "signal": ctx.wait_for_signal(EVIL_SIGNAL)}

    sa.event.listen(sql_engine, "before_cursor_execute", capture)
    try:
        run = engine.start(EVIL_WORKFLOW, {EVIL_STEP: EVIL_KEY}, idempotency_key=EVIL_KEY)
        dispatcher.run_until_idle()
        step = next(s for s in store.get_steps(run.run_id) if s.name == EVIL_STEP)
        assert step.task_name == EVIL_TASK
        assert engine.execute_step(run.run_id, step.id, EVIL_TASK + "2", lambda s: "x") is None
        with pytest.raises(UnknownWorkflowError):
            engine.start(EVIL_WORKFLOW + " OR 1=1")
        with pytest.raises(ValueError, match="is not a workflow run id"):
            engine.send_signal(EVIL_WORKFLOW, EVIL_SIGNAL)
        engine.send_signal(run.run_id, EVIL_SIGNAL, EVIL_KEY)
        dispatcher.run_until_idle()
        again = engine.start(EVIL_WORKFLOW, {EVIL_STEP: EVIL_KEY}, idempotency_key=EVIL_KEY)
        with pytest.raises(IdempotencyKeyReusedError):
            engine.start(EVIL_WORKFLOW, {EVIL_STEP: "other"}, idempotency_key=EVIL_KEY)
        listed = store.list_runs(workflow=EVIL_WORKFLOW, limit=1000)
    finally:
        sa.event.remove(sql_engine, "before_cursor_execute", capture)

    # Every name went to the database as a parameter, and came back verbatim.
    assert run.result() == {"step": EVIL_KEY, "signal": EVIL_KEY}
    assert again.run_id == run.run_id
    assert run.run_id in [r.id for r in listed]
    assert {s.name for s in store.get_steps(run.run_id)} == {EVIL_STEP, f"signal:{EVIL_SIGNAL}"}
    assert "but the message names" in caplog.text
    for name in EVIL:
        assert any(name in p for p in parameters), name
        assert not any(name in s for s in statements), name
    assert not any("DROP" in s or "DELETE FROM pikku_workflow_signal" in s for s in statements)
    # And every table is still there.
    assert {t.name for t in STORE_TABLES} <= set(sa.inspect(sql_engine).get_table_names())


# --- passwords are never shown ---------------------------------------------------------------


@pytest.fixture(scope="module")
def empty_pg_url() -> Iterator[str]:
    """A PostgreSQL database without pikku's tables; the URL carries a password
    (the server trusts loopback, so it is never checked, only shown or not)."""
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_nopw") as url:
        yield sa.make_url(url).set(password=SECRET).render_as_string(hide_password=False)


CLOSED_PORT_URLS = [
    f"postgresql+psycopg://pikku:{SECRET}@127.0.0.1:1/shop",
    f"mysql+pymysql://pikku:{SECRET}@127.0.0.1:1/shop",
]
BAD_URLS = [
    *CLOSED_PORT_URLS,
    f"postgresq://pikku:{SECRET}@127.0.0.1/shop",  # unknown dialect
    f"postgresql+psycopg//pikku:{SECRET}@127.0.0.1/shop",  # unparseable
]


@pytest.mark.parametrize("url", [*BAD_URLS, "missing-tables"])
def test_database_errors_never_show_the_password(
    url: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    if url == "missing-tables":
        url = request.getfixturevalue("empty_pg_url")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(Exception) as info:  # any error: what it shows is the point
        # an unparseable URL fails as the Pikku is built, a database that is
        # down or bare on the store's first use
        Pikku(Celery("security", set_as_current=False), database_url=url).store.list_runs()
    assert SECRET not in shown(info.value)
    assert SECRET not in caplog.text
    if isinstance(info.value, SchemaMissingError):
        assert ":***@127.0.0.1" in str(info.value)


def test_a_working_engine_never_shows_the_password(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = sa.make_url(postgres_url).set(password=SECRET).render_as_string(hide_password=False)
    caplog.set_level(logging.DEBUG)
    app = Celery("security", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = f"{QUEUE}-password"
    metadata.create_all(sa.create_engine(postgres_url, poolclass=sa.pool.NullPool))
    pikku = Pikku(app, database_url=url, install_beat=False)
    try:

        @pikku.workflow(name="security.idle")
        def idle(ctx: Context) -> Any:
            return ctx.wait_for_signal("go")

        run = pikku.start("security.idle")
        pikku.send_signal(run.run_id, "go", 1)
        pikku.orchestrate(run.run_id, "signal")
        assert run.result() == 1
        assert pikku.sql_engine is not None
        for text in (repr(pikku.sql_engine), str(pikku.sql_engine.url), caplog.text):
            assert SECRET not in text
    finally:
        assert pikku.sql_engine is not None
        pikku.sql_engine.dispose()


@pytest.mark.parametrize(
    ("args", "url"),
    [
        (["db", "check"], CLOSED_PORT_URLS[0]),
        (["db", "current"], CLOSED_PORT_URLS[1]),
        (["db", "upgrade"], CLOSED_PORT_URLS[0]),
        (["db", "check"], BAD_URLS[2]),
        (["db", "check"], "missing-tables"),
        (["db", "current"], "missing-tables"),
    ],
)
def test_cli_output_never_shows_the_password(
    args: list[str], url: str, request: pytest.FixtureRequest
) -> None:
    if url == "missing-tables":
        url = request.getfixturevalue("empty_pg_url")
    result = CliRunner().invoke(cli, [*args, "--database-url", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code != 0 or args[1] == "current", result.output
    assert SECRET not in result.output
    assert "pikku:***@127.0.0.1" in result.output or "postgres:***@127.0.0.1" in result.output


@pytest.mark.parametrize("url", [CLOSED_PORT_URLS[0], BAD_URLS[2], "missing-tables"])
def test_cli_output_for_an_app_never_shows_the_password(
    url: str, request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if url == "missing-tables":
        url = request.getfixturevalue("empty_pg_url")
    module = f"security_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        "from celery import Celery\n"
        "from pikku_celery import Pikku\n"
        "app = Celery('security', broker='memory://')\n"
        f"pikku = Pikku(app, database_url={url!r})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        result = CliRunner().invoke(cli, ["-A", f"{module}:pikku", "runs", "list"])
    finally:
        sys.modules.pop(module, None)
    assert result.exit_code == 2, result.output
    assert SECRET not in result.output
    if url == BAD_URLS[2]:  # unparseable: the import itself fails
        assert f"importing {module!r}" in result.output
    else:  # the import builds the Pikku without touching the database; the command does
        assert ":***@127.0.0.1" in result.output
