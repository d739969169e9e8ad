"""The testing kit: your own Pikku in a time-skipping test environment (issue 18, item 5).

Every Pikku here is built on a broker and a database that do not exist
(closed ports): had anything inside ``workflow_test_env`` sent a message or
opened a connection, the test would fail on it.
"""

from __future__ import annotations

import inspect
import itertools
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import Context, Pikku, RunStatus, WorkflowFailedError, WorkflowTimeoutError
from pikku_celery.celery.dispatcher import CeleryDispatcher
from pikku_celery.celery.step_body import attempt_task_id
from pikku_celery.engine.core import WorkflowEngine
from pikku_celery.engine.limits import Limits
from pikku_celery.testing import (
    InlineDispatcher,
    SentTask,
    WorkflowStuckError,
    WorkflowTestEnv,
    make_engine,
    workflow_test_env,
)

NO_BROKER = "redis://127.0.0.1:1/0"
NO_DATABASE = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Kit:
    """A user's project: a Celery app, its Pikku, tasks and workflows."""

    app: Celery
    pikku: Pikku
    seen: list[dict[str, Any]] = field(default_factory=list)
    workflows: dict[str, Any] = field(default_factory=dict)


def make_kit() -> Kit:
    app = Celery("kit", broker=NO_BROKER, set_as_current=False)
    # Were a message ever published, fail at once rather than retry the connection.
    app.conf.update(task_publish_retry=False, broker_connection_timeout=0.5)
    pikku = Pikku(app, NO_DATABASE, install_beat=False)
    kit = Kit(app, pikku)

    @app.task(name="kit.flaky", bind=True, shared=False)
    def flaky(self: Any, key: str, failures: int) -> dict[str, Any]:
        """Fails its first ``failures`` attempts, then returns what it saw."""
        request = self.request
        kit.seen.append(
            {
                "key": key,
                "id": request.id,
                "retries": request.retries,
                "root_id": request.root_id,
                "hostname": request.hostname,
                "routing_key": request.delivery_info.get("routing_key"),
            }
        )
        if request.retries < failures:
            raise ConnectionError(f"busy ({key}, try {request.retries + 1})")
        return {"key": key, "attempt": request.retries + 1}

    @app.task(name="kit.retrying", bind=True, shared=False)
    def retrying(self: Any, countdown: float) -> str:
        """Asks Celery for a retry in ``countdown`` s on its first attempt."""
        if self.request.retries == 0:
            raise self.retry(countdown=countdown, max_retries=3)
        return f"done on try {self.request.retries + 1}"

    @app.task(name="kit.notify", shared=False)
    def notify(order_id: int) -> None:
        """A side task the steps send with .delay()."""

    @app.task(name="kit.place", shared=False)
    def place(order_id: int) -> int:
        """A step that sends another task itself."""
        notify.delay(order_id)
        return order_id

    @pikku.workflow(name="kit.flaky_once")
    def flaky_once(ctx: Context, key: str) -> Any:
        return ctx.step("flaky", flaky, key, 1, retries=2)

    @pikku.workflow(name="kit.nap_and_backoff")
    def nap_and_backoff(ctx: Context, _: Any) -> Any:
        ctx.sleep("nap", 3600)
        # fails twice: waits 1 s, then 4 s (backoff 4) before the third attempt
        return ctx.step("flaky", flaky, "backoff", 2, retries=2, retry_delay=1, backoff=4)

    @pikku.workflow(name="kit.celery_retry")
    def celery_retry(ctx: Context, _: Any) -> Any:
        return ctx.step("retrying", retrying, 4, retries=1)

    @pikku.workflow(name="kit.place_order")
    def place_order(ctx: Context, order_id: int) -> Any:
        return ctx.step("place", place, order_id)

    @pikku.workflow(name="kit.approval")
    def approval(ctx: Context, _: Any) -> Any:
        return ctx.wait_for_signal("go")

    @pikku.workflow(name="kit.parent")
    def parent(ctx: Context, _: Any) -> Any:
        return ctx.child("wait", approval, None)

    @pikku.workflow(name="kit.forever")
    def forever(ctx: Context, _: Any) -> Any:
        for i in itertools.count():
            ctx.sleep(f"tick-{i}", 1)

    @pikku.workflow(name="kit.sleepy")
    def sleepy(ctx: Context, seconds: float) -> Any:
        ctx.sleep("sleep", seconds)
        return ctx.now().isoformat()

    @pikku.workflow(name="kit.plain_step")
    def plain_step(ctx: Context, x: int) -> Any:
        return ctx.step("double", double, x)

    kit.workflows.update(
        flaky_once=flaky_once,
        nap_and_backoff=nap_and_backoff,
        celery_retry=celery_retry,
        place_order=place_order,
        approval=approval,
        parent=parent,
        forever=forever,
        sleepy=sleepy,
        plain_step=plain_step,
    )
    return kit


def double(x: int) -> int:
    """A plain function, no Celery task."""
    return 2 * x


@pytest.fixture
def kit() -> Kit:
    return make_kit()


@pytest.fixture
def env(kit: Kit) -> Iterator[WorkflowTestEnv]:
    with workflow_test_env(kit.pikku) as env:
        yield env


# --- tasks run as a worker runs them -------------------------------------------


def test_a_bound_task_sees_a_real_request_per_attempt(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["flaky_once"].start("k")
    assert run.wait() == {"key": "k", "attempt": 2}
    step = run.steps()[0].step
    first, second = kit.seen
    assert [first["retries"], second["retries"]] == [0, 1]
    # A stable id per attempt, the id a worker's request would carry.
    assert first["id"] == attempt_task_id(_at_attempt(step, 1))
    assert second["id"] == attempt_task_id(step)
    assert first["id"] != second["id"]
    assert first["root_id"] == run.run_id
    assert first["hostname"] == "pikku-test-env@localhost"
    assert first["routing_key"] == "celery"


def test_a_task_failing_once_completes_on_attempt_2(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["flaky_once"].start("once")
    assert run.wait()["attempt"] == 2
    (history,) = run.steps()
    assert history.step.attempt == 2
    assert [str(a.status) for a in history.attempts] == ["failed", "succeeded"]
    assert "busy (once, try 1)" in str(history.attempts[0].error)


def test_self_retry_is_the_steps_retry_and_its_countdown_is_skipped(
    kit: Kit, env: WorkflowTestEnv
) -> None:
    run = kit.workflows["celery_retry"].start(None)
    assert run.wait() == "done on try 2"
    assert env.elapsed == pytest.approx(4.0)
    assert run.steps()[0].step.attempt == 2


def test_a_plain_function_is_a_task_once_registered(kit: Kit, env: WorkflowTestEnv) -> None:
    unregistered = kit.workflows["plain_step"].start(2)
    with pytest.raises(WorkflowFailedError, match=r"env\.task\(fn\)"):
        unregistered.wait()
    env.task(double)
    assert kit.workflows["plain_step"].start(21).wait() == 42


def test_a_registered_function_stands_in_for_a_celery_task(kit: Kit, env: WorkflowTestEnv) -> None:
    env.task(lambda key, failures: {"stub": key}, name="kit.flaky")
    assert kit.workflows["flaky_once"].start("s").wait() == {"stub": "s"}
    assert kit.seen == []  # the real task never ran


def test_a_bare_decorated_function_stands_in_for_the_task_of_its_name(
    kit: Kit, env: WorkflowTestEnv
) -> None:
    @env.task
    def flaky(key: str, failures: int) -> dict[str, str]:  # the function of kit.flaky
        return {"stub": key}

    assert kit.workflows["flaky_once"].start("s").wait() == {"stub": "s"}
    assert kit.seen == []  # the real task never ran
    assert flaky("k", 0) == {"stub": "k"}  # the function itself, still callable


def test_env_task_with_name_as_a_decorator(kit: Kit, env: WorkflowTestEnv) -> None:
    @env.task(name="kit.flaky", queue="stubs")
    def stub(key: str, failures: int) -> str:
        return f"stub {key}"

    run = kit.workflows["flaky_once"].start("n")
    assert run.wait() == "stub n"
    assert run.steps()[0].step.queue == "stubs"
    assert kit.seen == []


def test_a_bare_decorated_function_named_like_no_task_is_a_task_of_its_own(
    kit: Kit, env: WorkflowTestEnv
) -> None:
    @env.task
    def triple(x: int) -> int:
        return 3 * x

    @kit.pikku.workflow(name="kit.plain_triple")
    def plain_triple(ctx: Context, x: int) -> Any:
        return ctx.step("triple", triple, x)

    assert plain_triple.start(5).wait() == 15


def test_a_function_name_shared_by_several_tasks_needs_a_name(
    kit: Kit, env: WorkflowTestEnv
) -> None:
    def flaky(key: str, failures: int) -> None:
        """A second task whose function is named flaky."""

    kit.app.task(name="kit.other_flaky", shared=False)(flaky)
    with pytest.raises(ValueError, match=r"kit\.flaky, kit\.other_flaky.*name="):
        env.task(flaky)


# --- time skipping ---------------------------------------------------------------


def test_an_hour_of_sleep_and_a_4_s_backoff_take_no_time(
    kit: Kit, env: WorkflowTestEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_real_waiting(seconds: float) -> None:
        raise AssertionError(f"the test environment slept {seconds} s on the real clock")

    monkeypatch.setattr(time, "sleep", no_real_waiting)
    run = kit.workflows["nap_and_backoff"].start(None)
    assert run.wait() == {"key": "backoff", "attempt": 3}
    assert env.elapsed == pytest.approx(3600 + 1 + 4)
    attempts = run.steps()[1].attempts
    gaps = [(b.started_at - a.started_at) / 1000 for a, b in itertools.pairwise(attempts)]
    assert gaps == [1.0, 4.0]


def test_advance_moves_the_clock_and_runs_what_came_due(kit: Kit, env: WorkflowTestEnv) -> None:
    start = env.now
    run = kit.workflows["sleepy"].start(60)
    assert env.run_until_idle(skip_time=False) == 0  # the sleep's wake-up is not due
    assert run.status() == RunStatus.RUNNING
    env.advance(59)
    assert run.status() == RunStatus.RUNNING
    assert env.advance(1) == 1
    assert run.status() == RunStatus.COMPLETED
    assert datetime.fromisoformat(run.result()) == env.now  # ctx.now() after the sleep
    assert (env.now - start).total_seconds() == pytest.approx(60)


def test_the_clock_starts_where_told(kit: Kit) -> None:
    with workflow_test_env(kit.pikku, start=datetime(2030, 1, 1, tzinfo=UTC)) as env:
        run = kit.workflows["sleepy"].start(86_400)
        assert run.wait() == "2030-01-02T00:00:00+00:00"  # ctx.now() after a day's sleep
        assert env.now == datetime(2030, 1, 2, tzinfo=UTC)


def test_a_lost_wake_up_is_found_as_beat_would(kit: Kit, env: WorkflowTestEnv) -> None:
    env.dispatcher.drop = lambda msg: msg.kind == "run" and msg.reason == "timer"
    run = kit.workflows["sleepy"].start(30)
    assert env.queued == []  # the sleep's wake-up is lost
    env.dispatcher.drop = None
    run.wait()  # the store knows the timer: the sweep wakes the run when it is due
    assert env.elapsed == pytest.approx(30)
    assert [m.reason for m in env.sent if m.kind == "run"] == ["timer", "timer"]


# --- signals, and runs that cannot settle ---------------------------------------------


def test_a_signal_sent_during_the_wait(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["approval"].start(None)
    env.run_until_waiting(run, "go")
    assert env.waiting_for(run) == ["go"]
    kit.pikku.send_signal(run.run_id, "go", {"ok": True})
    assert run.wait() == {"ok": True}
    assert env.waiting_for(run) == []


def test_waiting_for_a_signal_nobody_sends_says_so(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["approval"].start(None)
    with pytest.raises(WorkflowStuckError) as caught:
        run.wait()
    message = str(caught.value)
    assert f"workflow run {run.run_id} (kit.approval) cannot settle" in message
    assert "waits for signal 'go' (no timeout), which nobody sent" in message
    assert "send_signal" in message
    assert caught.value.run_id == run.run_id
    assert isinstance(caught.value, WorkflowTimeoutError)  # as wait() on a run that never ends


def test_a_stuck_child_is_named(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["parent"].start(None)
    with pytest.raises(WorkflowStuckError, match=r"waits for child run .* \(kit\.approval\), "):
        env.wait(run)
    with pytest.raises(WorkflowStuckError, match="signal 'go'"):
        env.wait(run)


def test_a_workflow_that_never_ends_is_stopped(kit: Kit) -> None:
    with workflow_test_env(kit.pikku, max_messages=50) as env:
        run = kit.workflows["forever"].start(None)
        with pytest.raises(WorkflowStuckError, match="gave up after delivering 50 messages"):
            run.wait()
        with pytest.raises(WorkflowStuckError, match="gave up after delivering 5 messages"):
            env.run_until_idle(max_messages=5)


def test_run_until_waiting_for_a_signal_never_awaited(kit: Kit, env: WorkflowTestEnv) -> None:
    run = kit.workflows["sleepy"].start(1)
    with pytest.raises(WorkflowStuckError, match="never waited for signal 'go': it ended"):
        env.run_until_waiting(run, "go")


# --- the engine's own adapters, and no broker --------------------------------------------


def test_your_engine_keeps_its_own_adapters_and_reaches_the_envs_engine(kit: Kit) -> None:
    pikku = kit.pikku
    real = (pikku.store, pikku.leases, pikku.dispatcher, pikku.keeper)
    assert "send_task" not in kit.app.__dict__
    with workflow_test_env(pikku) as env:
        # Nothing that holds your engine's ports (a worker thread) sees them change...
        assert (pikku.store, pikku.leases, pikku.dispatcher, pikku.keeper) == real
        # ... while its entry points reach the environment's own engine.
        assert env.engine is not pikku
        assert (env.engine.store, env.engine.dispatcher) == (env.store, env.dispatcher)
        assert env.engine.registry is pikku.registry
        handle = kit.workflows["flaky_once"].start("x")
        assert handle.wait()["attempt"] == 2
        assert pikku.handle(handle.run_id).state().status == RunStatus.COMPLETED
    assert (pikku.store, pikku.leases, pikku.dispatcher, pikku.keeper) == real
    assert isinstance(pikku.dispatcher, CeleryDispatcher)
    assert pikku.start.__self__ is pikku
    assert "send_task" not in kit.app.__dict__
    assert not env.active
    assert [r.workflow for r in env.runs()] == ["kit.flaky_once"]  # still readable
    with pytest.raises(RuntimeError, match="not active"):
        env.run_until_idle()


def test_the_envs_engine_has_your_engines_options() -> None:
    app = Celery("kit-options", broker=NO_BROKER, set_as_current=False)
    chosen: dict[str, Any] = {
        "orchestration_queue": "flows",
        "run_lease_ttl": 31.0,
        "sweep_lease_ttl": 61.0,
        "sweep_backoff": 6.0,
        "message_grace": 32.0,
        "idle_after": 62.0,
        "max_input_bytes": 1234,
        "outcome_retry": 63.0,
        "outage_timeout": 3.0,
        "sweep_max_backoff": 301.0,
        "eager_steps": False,
        "eager_max_steps": 7,
        "eager_max_seconds": 1.5,
        "max_lease": 600.0,
        "max_steps_per_run": 99,
        "max_child_depth": 3,
    }
    pikku = Pikku(app, NO_DATABASE, install_beat=False, retention=timedelta(days=2), **chosen)
    # Every option the engine takes is chosen above: a new one must be carried too.
    taken = set(inspect.signature(WorkflowEngine.__init__).parameters)
    limits = {f.name for f in fields(Limits)}
    assert taken - {"self", "store", "leases", "dispatcher", "worker_id"} - limits <= set(chosen)
    env = workflow_test_env(pikku)
    own = env.engine
    for name, value in chosen.items():
        if name in limits:
            assert getattr(own.limits, name) == value, name
        else:
            assert getattr(own, name) == value, name
    assert own.limits == pikku.limits
    assert own.retention == timedelta(days=2)
    assert own.worker_id == pikku.worker_id
    assert own.observers is pikku.observers


def test_restored_after_an_error_too(kit: Kit) -> None:
    with pytest.raises(ZeroDivisionError), workflow_test_env(kit.pikku) as env:
        assert kit.pikku.send_signal.__self__ is env.engine
        _ = 1 / 0
    assert kit.pikku.send_signal.__self__ is kit.pikku
    assert not env.active


def test_the_class_is_the_same_context_manager(kit: Kit) -> None:
    with WorkflowTestEnv(kit.pikku, max_messages=100) as env:
        assert kit.pikku.start.__self__ is env.engine
        assert kit.workflows["sleepy"].start(5).wait() == env.now.isoformat()  # after the 5 s
    assert kit.pikku.start.__self__ is kit.pikku


def test_environments_do_not_nest_on_one_engine(kit: Kit, env: WorkflowTestEnv) -> None:
    with pytest.raises(RuntimeError, match="already inside a workflow_test_env"):
        workflow_test_env(kit.pikku).__enter__()
    assert kit.pikku.start.__self__ is env.engine


def test_no_message_reaches_the_broker(kit: Kit, env: WorkflowTestEnv) -> None:
    # The app's broker and database are closed ports: this runs only if
    # neither is ever used. Pikku's own messages go to the env's queue...
    run = kit.workflows["place_order"].start(7)
    assert run.wait() == 7
    assert [(m.kind, m.task_name) for m in env.sent] == [("step", "kit.place")]
    # ... and a task your step sends itself is recorded, not published.
    (sent,) = env.sent_tasks
    assert isinstance(sent, SentTask)
    assert (sent.name, sent.args, sent.kwargs) == ("kit.notify", (7,), {})


def test_a_plain_engine_keeps_its_inline_tasks() -> None:
    engine, dispatcher = make_engine()
    calls: list[int] = []

    @dispatcher.task
    def add_one(x: int) -> int:
        calls.append(x)
        return x + 1

    @engine.workflow(name="plain.wf")
    def wf(ctx: Context, x: int) -> Any:
        ctx.sleep("wait", 7200)
        return ctx.step("add", add_one, x)

    with workflow_test_env(engine) as env:
        assert isinstance(engine.dispatcher, InlineDispatcher)
        assert wf.start(1).wait() == 2
        assert env.elapsed == pytest.approx(7200)
    assert engine.dispatcher is dispatcher
    assert calls == [1]


def test_only_an_engine_is_accepted() -> None:
    with pytest.raises(TypeError, match="needs your Pikku"):
        workflow_test_env(object())  # type: ignore[arg-type]


# --- the pytest plugin ------------------------------------------------------------


APP_MODULE = """
from celery import Celery
from pikku_celery import Context, Pikku

app = Celery("proj", broker="redis://127.0.0.1:1/0")
pikku = Pikku(app, "postgresql+psycopg://nobody@127.0.0.1:1/nowhere")


@app.task(bind=True)
def charge(self, cents):
    if self.request.retries == 0:
        raise ConnectionError("busy")
    return cents


@pikku.workflow(name="proj.order")
def order(ctx: Context, cents: int) -> dict:
    charged = ctx.step("charge", charge, cents, retries=1, retry_delay=30)
    ctx.sleep("cooling-off", 3600)
    return {"charged": charged}
"""

TEST_MODULE = """
from proj import order


def test_order(pikku_test_env):
    run = order.start(1999)
    assert run.wait() == {"charged": 1999}
    assert pikku_test_env.elapsed == 3630


def test_pikku_is_the_projects(pikku):
    import proj

    assert pikku is proj.pikku
"""


def run_pytest(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "pikku_celery.testing.pytest_plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            *args,
        ],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_plugin_finds_the_pikku_the_ini_names(tmp_path: Path) -> None:
    (tmp_path / "proj.py").write_text(APP_MODULE)
    (tmp_path / "test_proj.py").write_text(TEST_MODULE)
    (tmp_path / "pytest.ini").write_text("[pytest]\npikku_app = proj:pikku\n")
    # A conftest `pikku` fixture chooses instead, below its directory.
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "conftest.py").write_text(
        textwrap.dedent(
            """
            import pytest

            import proj


            @pytest.fixture
            def pikku():
                return proj.pikku
            """
        )
    )
    (sub / "test_sub.py").write_text(TEST_MODULE.replace("test_order", "test_sub_order"))
    done = run_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout


def test_the_plugin_says_what_it_needs(tmp_path: Path) -> None:
    (tmp_path / "test_none.py").write_text("def test_x(pikku_test_env):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = run_pytest(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pikku_test_env needs your Pikku" in done.stdout
    assert "pikku_app" in done.stdout


def test_the_plugin_is_the_packages_pytest11_entry_point(request: pytest.FixtureRequest) -> None:
    name = "pikku_celery.testing.pytest_plugin"
    ours = [ep for ep in entry_points(group="pytest11") if ep.value == name]
    # Named as the module: `-p` or `pytest_plugins` naming it then loads nothing twice.
    assert [ep.name for ep in ours] == [name], "stale install? pip install -e ."
    assert request.config.pluginmanager.has_plugin(name)


def _at_attempt(step: Any, attempt: int) -> Any:
    from dataclasses import replace

    return replace(step, attempt=attempt)
