"""``pikku-celery`` against a real app module (``tests.cli.cliapp``), as a user runs it.

Runs are started through the engine; the memory broker's messages are never
consumed, so each test takes the worker's part by hand (``drive`` runs the
steps through pikku's own ``pikku.run_step`` task, ``orchestrate`` a pass).
Assertions read the ``--json`` output and the key facts of the human output.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from pikku_celery.cli import CliState, main
from pikku_celery.errors import UnknownWorkflowError
from pikku_celery.model.values import NewRun, StepKind, StepStatus
from pikku_celery.store import migrate

MODULE = "tests.cli.cliapp"
A = ("-A", MODULE)
UNKNOWN_RUN = "6f1c1e0e-1111-4222-8333-444455556666"


@pytest.fixture
def cliapp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh import of the test app on its own SQLite file."""
    monkeypatch.setenv("PIKKU_CLI_TEST_DB", str(tmp_path / "cli.db"))
    monkeypatch.delenv("PIKKU_APP", raising=False)
    monkeypatch.delenv("PIKKU_DATABASE_URL", raising=False)
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    yield module
    sys.modules.pop(MODULE, None)
    module.pikku.disconnect_signals()
    module.pikku.sql_engine.dispose()


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """Invoke the command; anything but a clean exit would be a traceback."""
    result = CliRunner().invoke(main, list(args), env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def ok_json(*args: str) -> Any:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def drive(app: Any, run_id: str) -> None:
    """Run every step the run is waiting on, as a worker would, until none is left."""
    pikku = app.pikku
    for _ in range(20):
        now = pikku.store.now_ms()
        due = [
            s
            for s in pikku.store.get_steps(run_id)
            if s.kind == StepKind.TASK
            and (
                s.status in (StepStatus.PENDING, StepStatus.SCHEDULED)
                or (
                    s.status == StepStatus.FAILED
                    and s.wake_at is not None
                    and s.wake_at <= now
                    and s.attempt < s.max_attempts
                )
            )
        ]
        if not due:
            return
        for s in due:
            pikku.run_step_task.apply(args=(run_id, s.id, s.attempt, s.task_name, s.queue))
    raise AssertionError(f"run {run_id} kept asking for steps")


def start(app: Any, workflow: str, data: Any = None) -> str:
    run_id: str = app.pikku.start(workflow, data).run_id
    time.sleep(0.003)  # distinct created_at, so "newest first" is well defined
    return run_id


def test_runs_show_shows_a_stored_value_that_is_not_json(cliapp: Any) -> None:
    """An operator's edit left invalid JSON in a step's result: ``runs show``
    shows the run and the stored text, never a traceback."""
    run_id = start(cliapp, "order", {"a": 2, "b": 3})
    drive(cliapp, run_id)
    with cliapp.pikku.sql_engine.begin() as conn:
        conn.exec_driver_sql(
            "UPDATE pikku_workflow_step SET result = '{bad' WHERE run_id = ? AND name = 'add'",
            (run_id,),
        )
    human = cli(*A, "runs", "show", run_id)
    assert human.exit_code == 0, human.output
    assert "{bad" in human.output and "add" in human.output
    shown = ok_json(*A, "runs", "show", run_id)
    add = next(step for step in shown["steps"] if step["name"] == "add")
    assert "{bad" in add["result"] and "column result" in add["result"]


def test_a_run_whose_workflow_this_worker_lacks_is_shown_blocked(cliapp: Any) -> None:
    """A run of a workflow no loaded code knows (a deploy that removed it, a
    worker of an older deploy) is not silently 'running': it says why."""
    run, _ = cliapp.pikku.store.create_run(NewRun(workflow="shop.retired_flow", input=1))
    with pytest.raises(UnknownWorkflowError):
        cliapp.pikku.orchestrate(run.id, "sweep")
    [listed] = [r for r in ok_json(*A, "runs", "list")["runs"] if r["id"] == run.id]
    assert listed["status"] == "running"
    assert "no workflow is registered as 'shop.retired_flow'" in listed["blocked"]
    human = cli(*A, "runs", "list")
    assert "(blocked)" in human.output and "shop.retired_flow" in human.output
    shown = cli(*A, "runs", "show", run.id)
    assert "blocked" in shown.output and "no workflow is registered" in shown.output


# --- runs list ---------------------------------------------------------------


def test_runs_list_filters_and_pages(cliapp: Any) -> None:
    orders = [start(cliapp, "order", {"a": i, "b": 1}) for i in range(3)]
    fragile = start(cliapp, "fragile", "x")
    drive(cliapp, fragile)  # fails for good: no retries
    waiting = start(cliapp, "approval")

    listed = ok_json(*A, "runs", "list")
    assert [r["id"] for r in listed["runs"]] == [waiting, fragile, *reversed(orders)]
    assert listed["page"] == 1 and listed["limit"] == 20 and listed["has_more"] is False
    first = listed["runs"][0]
    assert set(first) == {
        "id",
        "workflow",
        "workflow_version",
        "status",
        "created_at",
        "updated_at",
        "duration_s",
        "cancel_requested",
        "parent_run_id",
        "idempotency_key",
        "error",
        "blocked",
        "waiting",
    }
    by_id = {r["id"]: r for r in listed["runs"]}
    assert by_id[fragile]["status"] == "failed"
    assert "RuntimeError" in by_id[fragile]["error"]

    assert [r["id"] for r in ok_json(*A, "runs", "list", "--workflow", "order")["runs"]] == list(
        reversed(orders)
    )
    assert [r["id"] for r in ok_json(*A, "runs", "list", "--status", "failed")["runs"]] == [fragile]
    running = ok_json(*A, "runs", "list", "--status", "running", "--workflow", "approval")
    assert [r["id"] for r in running["runs"]] == [waiting]

    page1 = ok_json(*A, "runs", "list", "--limit", "2")
    page2 = ok_json(*A, "runs", "list", "--limit", "2", "--page", "2")
    page3 = ok_json(*A, "runs", "list", "--limit", "2", "--page", "3")
    assert (page1["has_more"], page2["has_more"], page3["has_more"]) == (True, True, False)
    paged = [r["id"] for p in (page1, page2, page3) for r in p["runs"]]
    assert paged == [r["id"] for r in listed["runs"]]
    assert ok_json(*A, "runs", "list", "--page", "9")["runs"] == []
    # the same pages by keyset: each page's next_cursor starts the next
    keyset = [ok_json(*A, "runs", "list", "--limit", "2")]
    while keyset[-1]["next_cursor"]:
        keyset.append(
            ok_json(*A, "runs", "list", "--limit", "2", "--before", keyset[-1]["next_cursor"])
        )
    assert [r["id"] for p in keyset for r in p["runs"]] == paged
    bad_cursor = cli(*A, "runs", "list", "--before", "yesterday")
    assert bad_cursor.exit_code == 2 and "not a runs-list cursor" in bad_cursor.output

    assert len(ok_json(*A, "runs", "list", "--since", "1h")["runs"]) == 5
    assert len(ok_json(*A, "runs", "list", "--since", "2000-01-01")["runs"]) == 5
    assert ok_json(*A, "runs", "list", "--since", "2999-01-01T00:00:00+02:00")["runs"] == []

    human = cli(*A, "runs", "list", "--limit", "2")
    assert human.exit_code == 0
    assert waiting in human.output and fragile in human.output
    assert orders[0] not in human.output
    assert "approval" in human.output and "failed" in human.output
    assert "--page 2" in human.output
    everything = cli(*A, "runs", "list").output
    assert all(run in everything for run in orders)
    assert "flaky refused 'x' [on purpose]" in everything  # brackets are not markup

    bad_since = cli(*A, "runs", "list", "--since", "yesterday")
    assert bad_since.exit_code == 2 and "neither an ISO datetime" in bad_since.output
    bad_status = cli(*A, "runs", "list", "--status", "lost")
    assert bad_status.exit_code == 2 and "'lost'" in bad_status.output
    assert cli(*A, "runs", "list", "--workflow", "nothing").output.strip() == "no runs match"


# --- runs show ---------------------------------------------------------------


def test_runs_show_lists_steps_with_attempts_durations_and_leases(cliapp: Any) -> None:
    done = start(cliapp, "order", {"a": 2, "b": 3})
    drive(cliapp, done)

    shown = ok_json(*A, "runs", "show", done)
    assert set(shown) == {
        "now",
        "run",
        "steps",
        "steps_after",
        "steps_limit",
        "next_steps",
        "steps_total",
        "step_counts",
        "signals",
        "timers",
        "children",
        "waiting",
        "audit",
        "events",
    }
    run = shown["run"]
    assert run["status"] == "completed" and run["output"] == {"total": 5, "label": "parcel-5"}
    assert run["input"] == {"a": 2, "b": 3} and run["duration_s"] >= 0
    add, ship = shown["steps"]
    assert (add["name"], add["task"], add["queue"], add["status"]) == (
        "add",
        "cliapp.add",
        "celery",
        "succeeded",
    )
    assert (ship["name"], ship["queue"], ship["result"]) == ("ship", "shipping", "parcel-5")
    assert add["attempt"] == 1 and add["lease_remaining_s"] is None
    assert add["duration_s"] is not None and add["duration_s"] >= 0
    [attempt] = add["attempts"]
    assert attempt["attempt"] == 1 and attempt["status"] == "succeeded"
    assert attempt["worker"] == cliapp.pikku.worker_id and attempt["result"] == 5
    assert attempt["dispatch"] == "broker"  # how the attempt reached its worker
    assert attempt["renewals"] == 0 and attempt["renewed_at"] is None  # too short to renew
    assert attempt["duration_s"] is not None

    human = cli(*A, "runs", "show", done)
    assert human.exit_code == 0
    for fact in (done, "order", "completed", "cliapp.add", "cliapp.ship", "shipping", "parcel-5"):
        assert fact in human.output
    assert "steps" in human.output and "attempts" in human.output
    assert cliapp.pikku.worker_id in human.output
    assert "dispatch" in human.output and "broker" in human.output
    assert "renewals" in human.output

    # A step a worker holds right now: its lease, counted down on the store's clock.
    busy = start(cliapp, "order", {"a": 1, "b": 1})
    [step] = cliapp.pikku.store.get_steps(busy)
    assert cliapp.pikku.store.claim_step(step.id, "cliapp.add", "other-host:42", 60_000)
    shown = ok_json(*A, "runs", "show", busy)
    [add] = shown["steps"]
    assert add["status"] == "running" and add["worker"] == "other-host:42"
    assert 0 < add["lease_remaining_s"] <= 60
    assert add["attempts"][0]["status"] == "running"
    text = cli(*A, "runs", "show", busy).output
    row = next(line for line in text.splitlines() if "cliapp.add" in line)
    assert "other-host:42" in row and "running" in row
    assert re.search(r"\b(59|60)\.\d s\b", row), row
    assert "so far" in text


def test_a_failed_run_shows_its_error_and_retry_resumes_it_with_a_fresh_attempt(
    cliapp: Any,
) -> None:
    run_id = start(cliapp, "fragile", {"sku": "A-1"})
    drive(cliapp, run_id)
    shown = ok_json(*A, "runs", "show", run_id)
    assert shown["run"]["status"] == "failed"
    assert shown["run"]["error"]["type"] == "StepFailedError"
    [step] = shown["steps"]
    assert [a["status"] for a in step["attempts"]] == ["failed"]
    assert step["attempts"][0]["error"]["type"] == "RuntimeError"
    human = cli(*A, "runs", "show", run_id).output
    assert "RuntimeError: flaky refused {'sku': 'A-1'} [on purpose]" in human

    cliapp.FAILING.clear()
    retried = ok_json(*A, "runs", "retry", run_id)
    assert retried["id"] == run_id and retried["status"] == "running"
    assert retried["retried_steps"] == [{"name": "flaky", "next_attempt": 2, "max_attempts": 2}]
    cliapp.pikku.orchestrate(run_id)  # the wake-up the retry sent
    drive(cliapp, run_id)

    shown = ok_json(*A, "runs", "show", run_id)
    assert shown["run"]["status"] == "completed" and shown["run"]["output"] == {"sku": "A-1"}
    [step] = shown["steps"]
    assert [(a["attempt"], a["status"]) for a in step["attempts"]] == [
        (1, "failed"),
        (2, "succeeded"),
    ]

    again = cli(*A, "runs", "retry", run_id)
    assert again.exit_code == 1
    assert "only a failed run can be retried" in again.output


def test_retry_prints_which_steps_resume(cliapp: Any) -> None:
    run_id = start(cliapp, "fragile", 1)
    drive(cliapp, run_id)
    result = cli(*A, "runs", "retry", run_id)
    assert result.exit_code == 0, result.output
    assert run_id in result.output and "'flaky' from attempt 2" in result.output


# --- cancel and signal -------------------------------------------------------


def test_cancel_then_the_next_pass_ends_the_run_cancelled(cliapp: Any) -> None:
    run_id = start(cliapp, "order", {"a": 1, "b": 2})
    result = cli(*A, "runs", "cancel", run_id)
    assert result.exit_code == 0, result.output
    assert f"cancel requested for run {run_id}" in result.output
    shown = ok_json(*A, "runs", "show", run_id)
    assert shown["run"]["cancel_requested"] is True and shown["run"]["status"] == "running"
    assert "cancel requested" in cli(*A, "runs", "show", run_id).output

    cliapp.pikku.orchestrate(run_id)
    assert ok_json(*A, "runs", "show", run_id)["run"]["status"] == "cancelled"
    assert [r["id"] for r in ok_json(*A, "runs", "list", "--status", "cancelled")["runs"]] == [
        run_id
    ]

    again = cli(*A, "runs", "cancel", run_id)
    assert again.exit_code == 1 and "already cancelled" in again.output


def test_cancel_json(cliapp: Any) -> None:
    run_id = start(cliapp, "approval")
    cancelled = ok_json(*A, "runs", "cancel", run_id)
    assert cancelled["id"] == run_id and cancelled["cancel_requested"] is True


def test_signal_with_good_and_bad_json(cliapp: Any) -> None:
    run_id = start(cliapp, "approval")
    bad = cli(*A, "signal", run_id, "approve", '{"ok": tru')
    assert bad.exit_code == 2
    assert "not valid JSON" in bad.output and "line 1 column" in bad.output
    assert ok_json(*A, "runs", "show", run_id)["run"]["status"] == "running"  # nothing sent

    result = cli(*A, "signal", run_id, "approve", '{"ok": true, "by": "ops"}')
    assert result.exit_code == 0, result.output
    assert f"signal 'approve' sent to run {run_id}" in result.output
    cliapp.pikku.orchestrate(run_id)
    shown = ok_json(*A, "runs", "show", run_id)
    assert shown["run"]["status"] == "completed"
    assert shown["run"]["output"] == {"ok": True, "by": "ops"}

    late = cli(*A, "signal", run_id, "approve", "1")
    assert late.exit_code == 1 and "takes no signals" in late.output

    other = start(cliapp, "approval")
    sent = ok_json(*A, "signal", other, "approve")  # the payload defaults to null
    assert sent["signal"] == {"name": "approve", "payload": None}
    cliapp.pikku.orchestrate(other)
    shown = ok_json(*A, "runs", "show", other)
    assert shown["run"]["status"] == "completed" and shown["run"]["output"] is None


# --- sweep and leases --------------------------------------------------------


def test_sweep_once_resends_a_lost_step_message(cliapp: Any) -> None:
    run_id = start(cliapp, "order", {"a": 1, "b": 1})
    time.sleep(0.01)  # older than message_grace (0 s in the test app)
    report = ok_json(*A, "sweep", "--once")
    assert set(report) == {
        "requeued_lapsed",
        "expired",
        "resent",
        "due",
        "idle",
        "admitted",
        "overdue",
        "total",
        "skipped",
    }
    assert report["resent"] == 1 and report["total"] >= 1 and report["skipped"] is False
    [step] = cliapp.pikku.store.get_steps(run_id)
    assert step.status == StepStatus.SCHEDULED

    human = cli(*A, "sweep", "--once")
    assert human.exit_code == 0
    assert "messages resent" in human.output and "total" in human.output


def test_sweep_without_once_repeats_until_interrupted(
    cliapp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("pikku_celery.cli.ops.time.sleep", sleep)
    result = cli(*A, "sweep", "--interval", "0.5", "--json")
    assert result.exit_code == 0
    assert pauses == [0.5, 0.5] and result.output.count('"total"') == 2


def test_leases_names_each_queue_its_lease_and_why(cliapp: Any) -> None:
    leases = ok_json(*A, "leases")
    assert leases["transport"] == "memory"
    queues = {q["queue"]: q for q in leases["queues"]}
    assert set(queues) == {"celery", "shipping"}
    sweep = cliapp.pikku.sweep_interval
    assert queues["shipping"] == {
        "queue": "shipping",
        "seconds": 45.0,
        "source": "min of pikku queue_leases 45 s and step_lease 60 s",
        "horizon": 45.0,
        "horizon_source": "pikku queue_leases",
        "step_lease": 60.0,
        "renewal_s": 22.5,
        "sweep_interval_s": sweep,
        "takeover_within_s": 45.0 + sweep,
        "tasks": ["cliapp.ship"],
        "unclaimed_steps": 0,
        "oldest_unclaimed_s": None,
    }
    celery = queues["celery"]
    assert (celery["horizon"], celery["horizon_source"]) == (300.0, "pikku's default horizon")
    assert celery["seconds"] == 60.0 and celery["renewal_s"] == 30.0
    assert celery["source"] == "min of pikku's default horizon 300 s and step_lease 60 s"
    assert celery["takeover_within_s"] == 60.0 + sweep
    # Every task the app knows, shared tasks of installed libraries too.
    assert {"cliapp.add", "cliapp.flaky"} <= set(queues["celery"]["tasks"])
    assert "cliapp.ship" not in queues["celery"]["tasks"]

    human = cli(*A, "leases", env={"COLUMNS": "250"})
    assert human.exit_code == 0
    shipping = next(line for line in human.output.splitlines() if "shipping" in line)
    assert "45 s (pikku queue_leases)" in shipping and "cliapp.ship" in shipping
    assert f"{45 + sweep:g} s" in shipping and "22.5 s" in shipping
    assert "celery: lease 60 s = min of pikku's default horizon 300 s and step_lease 60 s" in (
        human.output
    )
    assert "transport: memory" in human.output


def test_leases_names_a_queue_whose_steps_no_worker_claims(cliapp: Any) -> None:
    cliapp.pikku.start("order", {"a": 1, "b": 2})  # its first step waits on 'celery'
    leases = ok_json(*A, "leases")
    queues = {q["queue"]: q for q in leases["queues"]}
    assert queues["celery"]["unclaimed_steps"] == 1
    assert queues["celery"]["oldest_unclaimed_s"] >= 0
    assert queues["shipping"]["unclaimed_steps"] == 0

    human = cli(*A, "leases")
    assert human.exit_code == 0
    assert "queue 'celery': 1 step(s) sent but unclaimed" in human.output
    assert "celery worker -Q celery" in human.output
    assert "queue 'shipping'" not in human.output


# --- finding the app ---------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [MODULE, f"{MODULE}:pikku", f"{MODULE}:app", f"{MODULE}.pikku", f" {MODULE} "],
)
def test_app_specs_that_name_the_pikku(cliapp: Any, spec: str) -> None:
    run_id = start(cliapp, "approval")
    result = cli("-A", spec, "runs", "list", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs"][0]["id"] == run_id


def test_app_from_the_environment(cliapp: Any) -> None:
    run_id = start(cliapp, "approval")
    result = cli("runs", "list", "--json", env={"PIKKU_APP": MODULE})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs"][0]["id"] == run_id


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.cli.nope", "no module named 'tests.cli.nope'"),
        ("no_such_top_level_module", "no module named 'no_such_top_level_module'"),
        ("tests.cli.no_pikku", "no Pikku instance found"),
        ("tests.cli.no_pikku:app", "no Pikku(app, ...) built on it was found"),
        ("tests.cli", "in tests.cli; name it with -A tests.cli:ATTR"),
        (f"{MODULE}:nothing", f"module '{MODULE}' has no attribute 'nothing'"),
        (f"{MODULE}:order", "is a Workflow, not a pikku_celery.Pikku"),
        (f"{MODULE}:", "is not MODULE or MODULE:ATTR"),
        (
            "tests.cli.broken_import",
            "importing 'tests.cli.broken_import' failed: "
            "No module named 'pikku_cli_test_missing_dependency'",
        ),
    ],
)
def test_app_spec_errors_say_what_was_looked_for(cliapp: Any, spec: str, message: str) -> None:
    result = cli("-A", spec, "runs", "list")
    assert result.exit_code == 2
    assert "-A/--app" in result.output and message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("spec", ["tests.cli.lazy_app:pikku", "tests.cli.lazy_app.pikku"])
def test_a_pikku_built_on_first_access(
    cliapp: Any, spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = start(cliapp, "approval")
    assert ok_json("-A", spec, "runs", "list")["runs"][0]["id"] == run_id
    monkeypatch.setenv("PIKKU_CLI_LAZY_FAIL", "1")
    result = cli("-A", spec, "runs", "list")
    assert result.exit_code == 2
    assert "reading tests.cli.lazy_app:pikku failed: RuntimeError: settings lack" in result.output


def test_a_command_that_needs_the_app_says_how_to_name_it() -> None:
    result = cli("leases", env={"PIKKU_APP": ""})
    assert result.exit_code == 2 and "pass -A/--app MODULE[:ATTR]" in result.output


# --- bad run ids -------------------------------------------------------------


COMMANDS_TAKING_A_RUN = [
    ("runs", "show"),
    ("runs", "cancel"),
    ("runs", "retry"),
    ("signal",),
]


@pytest.mark.parametrize("command", COMMANDS_TAKING_A_RUN)
def test_malformed_run_ids_are_refused_before_anything_is_read(
    command: tuple[str, ...],
) -> None:
    # No -A: the id is refused before the app is even imported.
    extra = ("approve",) if command == ("signal",) else ()
    result = cli(*command, "not-a-run", *extra)
    assert result.exit_code == 2
    assert "'not-a-run' is not a workflow run id (a UUID)" in result.output


@pytest.mark.parametrize("command", COMMANDS_TAKING_A_RUN)
def test_unknown_runs_are_a_clear_error(cliapp: Any, command: tuple[str, ...]) -> None:
    extra = ("approve",) if command == ("signal",) else ()
    result = cli(*A, *command, UNKNOWN_RUN, *extra)
    assert result.exit_code == 1
    assert f"no workflow run '{UNKNOWN_RUN}'" in result.output


# --- the database ------------------------------------------------------------


def test_db_commands_take_the_database_url_from_the_app(cliapp: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "cli.db")
    fresh = cli(*A, "db", "check")  # building the app's Pikku made no tables
    assert fresh.exit_code == 1 and "missing" in fresh.output
    cliapp.pikku.store.list_runs()  # the embedded SQLite store makes them on first use
    checked = cli(*A, "db", "check")
    assert checked.exit_code == 0, checked.output
    assert path in checked.output and f"up to date (revision {migrate.head()})" in checked.output
    current = cli(*A, "db", "current")
    assert current.exit_code == 0 and path in current.output
    assert f"head: {migrate.head()}" in current.output
    other = tmp_path / "other.db"
    explicit = cli(*A, "db", "upgrade", "--database-url", f"sqlite:///{other}")
    assert explicit.exit_code == 0 and str(other) in explicit.output
    assert f"upgraded to revision {migrate.head()}" in explicit.output


def test_db_upgrade_of_the_apps_own_sqlite_file(cliapp: Any) -> None:
    upgraded = cli(*A, "db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output


def test_db_without_url_or_app_is_a_usage_error() -> None:
    result = cli("db", "check", env={"PIKKU_DATABASE_URL": "", "PIKKU_APP": ""})
    assert result.exit_code == 2 and "--database-url" in result.output


@pytest.fixture
def unreachable() -> Iterator[str]:
    sys.modules.pop("tests.cli.unreachable_app", None)
    yield "pa55-cli-secret"
    sys.modules.pop("tests.cli.unreachable_app", None)


@pytest.mark.parametrize(
    "command",
    [("runs", "list"), ("runs", "show", UNKNOWN_RUN), ("leases",), ("sweep", "--once")],
)
def test_an_unreachable_database_is_one_masked_line_and_exit_2(
    unreachable: str, command: tuple[str, ...]
) -> None:
    result = cli("-A", "tests.cli.unreachable_app", *command)
    assert result.exit_code == 2, result.output
    assert "unreachable" in result.output and "127.0.0.1" in result.output
    assert unreachable not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["check", "current", "upgrade"])
def test_db_commands_on_an_unreachable_database(unreachable: str, command: str) -> None:
    result = cli("-A", "tests.cli.unreachable_app", "db", command)
    assert result.exit_code == 2, result.output
    assert "postgresql+psycopg://pikku:***@127.0.0.1:9/nowhere" in result.output
    assert unreachable not in result.output
    url = f"postgresql+psycopg://pikku:{unreachable}@127.0.0.1:9/nowhere"
    explicit = cli("db", command, "--database-url", url)
    assert explicit.exit_code == 2 and unreachable not in explicit.output
    assert "pikku:***@" in explicit.output


def test_unusable_database_urls_are_clean_errors() -> None:
    for url in ("not a url", "nosuchdialect://x/y"):
        result = cli("db", "check", "--database-url", url)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output


# --- --database-url: another workflow store than the app's ---------------------


@pytest.fixture
def other(cliapp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Another deployment of the test app, on its own database (``other.url``):
    its runs are not in the database the ``-A`` app points at."""
    path = tmp_path / "other.db"
    monkeypatch.setenv("PIKKU_CLI_TEST_DB", str(path))
    spec = importlib.util.spec_from_file_location(
        "tests.cli.other_deployment", Path(__file__).with_name("cliapp.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setenv("PIKKU_CLI_TEST_DB", str(tmp_path / "cli.db"))
    module.url = f"sqlite:///{path}"
    module.pikku.store.list_runs()  # the deployment's SQLite store makes its tables
    yield module
    module.pikku.disconnect_signals()
    module.pikku.sql_engine.dispose()


def test_runs_list_reads_the_database_url_not_the_apps_database(
    cliapp: Any, other: Any, tmp_path: Path
) -> None:
    in_app = cliapp.pikku.start("approval").run_id
    elsewhere = other.pikku.start("approval").run_id
    url = ("--database-url", other.url)

    def ids(result: Result) -> list[str]:
        assert result.exit_code == 0, result.output
        return [r["id"] for r in json.loads(result.stdout)["runs"]]

    assert ids(cli(*A, "runs", "list", "--json")) == [in_app]
    assert ids(cli(*A, "runs", "list", "--json", *url)) == [elsewhere]
    assert ids(cli("runs", "list", "--json", *url)) == [elsewhere]  # no -A: the URL alone
    human = cli("runs", "list", *url)
    assert human.exit_code == 0 and elsewhere in human.output and in_app not in human.output
    embedded = CliRunner().invoke(
        main, ["runs", "list", "--json", *url], obj=CliState(pikku=cliapp.pikku)
    )
    assert ids(embedded) == [elsewhere]

    # From the environment too; as it is easy to leave set, it is named on stderr.
    from_env = cli(*A, "runs", "list", "--json", env={"PIKKU_DATABASE_URL": other.url})
    assert ids(from_env) == [elsewhere]
    assert "note: PIKKU_DATABASE_URL is set" in from_env.stderr
    assert str(tmp_path / "other.db") in from_env.stderr
    assert "note:" not in cli(*A, "runs", "list", *url).stderr  # given on the line: no note
    own = cli(
        *A, "runs", "list", "--json", env={"PIKKU_DATABASE_URL": f"sqlite:///{tmp_path / 'cli.db'}"}
    )
    assert ids(own) == [in_app] and own.stderr == ""  # the app's own database: as without it


def test_runs_show_prints_a_page_of_steps_and_how_many_more(cliapp: Any) -> None:
    done = start(cliapp, "order", {"a": 2, "b": 3})
    drive(cliapp, done)
    first = cli(*A, "runs", "show", done, "--steps", "1")
    assert first.exit_code == 0, first.output
    assert "cliapp.add" in first.output and "cliapp.ship" not in first.output
    assert "1 more step(s) not shown: add --steps-after 0" in first.output
    rest = cli(*A, "runs", "show", done, "--steps", "1", "--steps-after", "0")
    assert "cliapp.ship" in rest.output and "cliapp.add" not in rest.output
    assert "more step(s) not shown" not in rest.output
    whole = cli(*A, "runs", "show", done)
    assert "cliapp.add" in whole.output and "cliapp.ship" in whole.output
    assert "not shown" not in whole.output

    shown = ok_json(*A, "runs", "show", done, "--steps", "1")
    assert [s["name"] for s in shown["steps"]] == ["add"]
    assert (shown["next_steps"], shown["steps_total"]) == (0, 2)
    assert cli(*A, "runs", "show", done, "--steps", "0").exit_code == 2


def test_runs_show_of_a_run_only_in_the_database_url(cliapp: Any, other: Any) -> None:
    run_id = other.pikku.start("order", {"a": 2, "b": 3}).run_id
    drive(other, run_id)
    url = ("--database-url", other.url)

    missing = cli(*A, "runs", "show", run_id)
    assert missing.exit_code == 1 and f"no workflow run '{run_id}'" in missing.output
    for app in ((), A):
        shown = ok_json(*app, "runs", "show", run_id, *url)
        assert shown["run"]["status"] == "completed"
        assert shown["run"]["output"] == {"total": 5, "label": "parcel-5"}
        assert [(s["name"], s["status"]) for s in shown["steps"]] == [
            ("add", "succeeded"),
            ("ship", "succeeded"),
        ]
        assert shown["steps"][0]["attempts"][0]["worker"] == other.pikku.worker_id
    human = cli("runs", "show", run_id, *url)
    assert human.exit_code == 0
    assert all(fact in human.output for fact in (run_id, "order", "completed", "parcel-5"))
    unknown = cli("runs", "show", UNKNOWN_RUN, *url)
    assert unknown.exit_code == 1 and f"no workflow run '{UNKNOWN_RUN}'" in unknown.output


def test_leases_of_the_database_url_with_and_without_the_app(cliapp: Any, other: Any) -> None:
    run_id = other.pikku.start("order", {"a": 1, "b": 2}).run_id  # waits on 'celery', in A
    url = ("--database-url", other.url)

    # With -A: the app's queues and leases, the URL's unclaimed steps.
    queues = {q["queue"]: q for q in ok_json(*A, "leases", *url)["queues"]}
    assert (queues["celery"]["horizon"], queues["celery"]["unclaimed_steps"]) == (300.0, 1)
    assert (queues["shipping"]["seconds"], queues["shipping"]["unclaimed_steps"]) == (45.0, 0)
    assert {q["queue"]: q["unclaimed_steps"] for q in ok_json(*A, "leases")["queues"]} == {
        "celery": 0,
        "shipping": 0,
    }

    # Without -A: only the unclaimed steps, past pikku's default message_grace (30 s).
    assert ok_json("leases", *url) == {"transport": None, "queues": []}
    none = cli("leases", *url)
    assert none.exit_code == 0
    assert f"no task step in {other.url} has waited unclaimed longer than 30 s" in none.stdout
    assert "pass -A/--app to see them" in none.stderr
    with other.pikku.sql_engine.begin() as conn:  # sent two minutes ago, never claimed
        conn.exec_driver_sql(
            "UPDATE pikku_workflow_step SET scheduled_at = scheduled_at - 120000, "
            "created_at = created_at - 120000 WHERE run_id = ?",
            (run_id,),
        )
    [waiting] = ok_json("leases", *url)["queues"]
    assert waiting["oldest_unclaimed_s"] >= 120
    assert {k: v for k, v in waiting.items() if k != "oldest_unclaimed_s"} == {
        "queue": "celery",
        "seconds": None,
        "source": None,
        "horizon": None,
        "horizon_source": None,
        "step_lease": None,
        "renewal_s": None,
        "sweep_interval_s": None,
        "takeover_within_s": None,
        "tasks": [],
        "unclaimed_steps": 1,
    }
    human = cli("leases", *url)
    assert human.exit_code == 0
    row = next(line for line in human.stdout.splitlines() if "celery" in line)
    assert "needs -A" in row and "1 (oldest 2 m" in row
    assert "queue 'celery': 1 step(s) sent but unclaimed" in human.stderr
    assert "lease lengths come from your Celery app's configuration" in human.stderr


def test_signal_cancel_and_retry_write_to_the_database_url(cliapp: Any, other: Any) -> None:
    url = ("--database-url", other.url)

    waiting = other.pikku.start("approval").run_id
    assert cli(*A, "signal", waiting, "approve", "1").exit_code == 1  # not in the app's database
    sent = cli(*A, "signal", waiting, "approve", '{"by": "ops"}', *url)
    assert sent.exit_code == 0, sent.output
    assert f"signal 'approve' sent to run {waiting}" in sent.output
    other.pikku.orchestrate(waiting)  # the deployment's worker takes the wake-up
    assert ok_json("runs", "show", waiting, *url)["run"]["output"] == {"by": "ops"}

    doomed = other.pikku.start("approval").run_id
    assert ok_json(*A, "runs", "cancel", doomed, *url)["cancel_requested"] is True
    other.pikku.orchestrate(doomed)
    assert ok_json("runs", "show", doomed, *url)["run"]["status"] == "cancelled"

    fragile = other.pikku.start("fragile", "x").run_id
    drive(other, fragile)
    other.FAILING.clear()
    retried = ok_json(*A, "runs", "retry", fragile, *url)
    assert retried["status"] == "running"
    assert retried["retried_steps"] == [{"name": "flaky", "next_attempt": 2, "max_attempts": 2}]
    other.pikku.orchestrate(fragile)
    drive(other, fragile)
    assert ok_json("runs", "show", fragile, *url)["run"]["status"] == "completed"
    assert ok_json(*A, "runs", "list")["runs"] == []  # the app's database saw none of it


def test_sweep_of_the_database_url_keeps_the_apps_options(cliapp: Any, other: Any) -> None:
    cliapp.pikku.start("order", {"a": 1, "b": 1})
    lost = [other.pikku.start("order", {"a": i, "b": 1}).run_id for i in range(2)]
    # message_grace is 0 s in the app (pikku's default is 30 s): every step
    # sent counts as possibly lost, here and in the app's own database.
    report = ok_json(*A, "sweep", "--once", "--database-url", other.url)
    assert report["resent"] == 2 and report["skipped"] is False
    assert ok_json(*A, "sweep", "--once")["resent"] == 1
    for run_id in lost:
        [step] = ok_json("runs", "show", run_id, "--database-url", other.url)["steps"]
        assert step["status"] == "scheduled"


SENDING_COMMANDS = [
    ("runs", "cancel", "{run}"),
    ("runs", "retry", "{run}"),
    ("signal", "{run}", "approve"),
    ("sweep", "--once"),
]


@pytest.mark.parametrize("command", SENDING_COMMANDS)
def test_commands_that_send_messages_need_the_app_too(other: Any, command: tuple[str, ...]) -> None:
    run_id = other.pikku.start("approval").run_id
    args = [part.format(run=run_id) for part in command]
    result = cli(*args, "--database-url", other.url)
    assert result.exit_code == 2, result.output
    assert "--database-url alone is not enough here" in result.output
    assert "through your Celery app" in result.output
    assert "pass -A/--app MODULE[:ATTR]" in result.output and "nothing was changed" in result.output
    shown = ok_json("runs", "show", run_id, "--database-url", other.url)
    assert shown["run"]["status"] == "running" and shown["run"]["cancel_requested"] is False
    other.pikku.orchestrate(run_id)  # no signal arrived: the run still waits
    assert ok_json("runs", "show", run_id, "--database-url", other.url)["run"]["status"] == (
        "running"
    )


def test_a_command_without_app_or_database_url_names_both(cliapp: Any) -> None:
    result = cli("runs", "list")
    assert result.exit_code == 2
    assert "pass -A/--app MODULE[:ATTR]" in result.output and "--database-url" in result.output


URL_SECRET = "pa55-url-secret"
UNREACHABLE_URL = f"postgresql+psycopg://pikku:{URL_SECRET}@127.0.0.1:9/nowhere"


@pytest.mark.parametrize(
    "command",
    [
        ("runs", "list"),
        ("runs", "show", UNKNOWN_RUN),
        ("leases",),
        (*A, "leases"),
        (*A, "sweep", "--once"),
        (*A, "runs", "cancel", UNKNOWN_RUN),
        (*A, "runs", "retry", UNKNOWN_RUN),
        (*A, "signal", UNKNOWN_RUN, "approve"),
    ],
)
def test_an_unreachable_database_url_is_one_masked_line_and_exit_2(
    cliapp: Any, command: tuple[str, ...]
) -> None:
    result = cli(*command, "--database-url", UNREACHABLE_URL)
    assert result.exit_code == 2, result.output
    assert "unreachable" in result.output and "pikku:***@127.0.0.1:9/nowhere" in result.output
    assert URL_SECRET not in result.output and "Traceback" not in result.output


def test_a_database_url_without_pikkus_tables_is_refused_not_created(
    cliapp: Any, tmp_path: Path
) -> None:
    typo = tmp_path / "typo.db"
    for command in (("runs", "list"), (*A, "sweep", "--once")):
        result = cli(*command, "--database-url", f"sqlite:///{typo}")
        assert result.exit_code == 2, result.output
        assert "no such SQLite file" in result.output
        assert f"pikku-celery db upgrade --database-url 'sqlite:///{typo}'" in result.output
    assert not typo.exists()

    empty = tmp_path / "empty.db"
    empty.touch()
    url = f"sqlite:///{empty}"
    refused = cli("runs", "list", "--database-url", url)
    assert refused.exit_code == 2 and "tables are missing" in refused.output
    assert f"pikku-celery db upgrade --database-url '{url}'" in refused.output
    assert cli("db", "upgrade", "--database-url", url).exit_code == 0
    assert cli("runs", "list", "--database-url", url).output.strip() == "no runs match"


@pytest.mark.parametrize(
    "url", [f"postgresql+psycopg//pikku:{URL_SECRET}@h/db", f"nosuch://pikku:{URL_SECRET}@h/db"]
)
def test_an_unusable_database_url_is_a_clean_error(cliapp: Any, url: str) -> None:
    result = cli("runs", "list", "--database-url", url)
    assert result.exit_code == 2, result.output
    assert "--database-url: cannot" in result.output
    assert URL_SECRET not in result.output and "Traceback" not in result.output


# --- help --------------------------------------------------------------------


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))


def test_every_command_has_help() -> None:
    paths = list(_commands(main))
    assert {p[0] for p in paths} == {"db", "runs", "signal", "sweep", "leases", "web", "schedules"}
    for path in [(), *paths]:
        result = cli(*path, "--help")
        assert result.exit_code == 0, path
        summary = result.output.split("\n\n")[1].strip()
        assert summary, f"{' '.join(path)} has no help text"
    for path in paths:
        ctx = click.Context(main)
        command: click.Command | None = main
        for part in path:
            assert isinstance(command, click.Group)
            command = command.get_command(ctx, part)
        assert command is not None and command.help, path


def test_every_command_takes_the_database_url() -> None:
    leaves = [p for p in _commands(main) if not isinstance(_command(p), click.Group)]
    assert len(leaves) == 15
    for path in leaves:
        result = cli(*path, "--help")
        assert result.exit_code == 0, path
        assert "--database-url URL" in result.output and "PIKKU_DATABASE_URL" in result.output, path


def _command(path: tuple[str, ...]) -> click.Command | None:
    ctx = click.Context(main)
    command: click.Command | None = main
    for part in path:
        assert isinstance(command, click.Group)
        command = command.get_command(ctx, part)
    return command
