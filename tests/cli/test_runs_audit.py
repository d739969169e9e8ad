"""``runs show`` and ``runs list`` say what a person needs to follow a run:
the steps' arguments (cut short, ``--full`` whole), each attempt's node and
Celery task id, the operator actions (the command line's own with the OS
user and host), and which live runs wait for a signal or sleep."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from tests.cli.test_cli import A, cli, cliapp, drive, ok_json, start

__all__ = ["cliapp"]  # the fixture, shared with test_cli


def test_a_retried_run_shows_its_failure_the_retry_and_where_each_attempt_ran(
    cliapp: Any,
) -> None:
    long_value = {"sku": "A-1", "note": "fragile, " * 30}
    run_id = start(cliapp, "fragile", long_value)
    drive(cliapp, run_id)
    assert cli(*A, "runs", "retry", run_id).exit_code == 0
    cliapp.FAILING.clear()
    cliapp.pikku.orchestrate(run_id)
    drive(cliapp, run_id)

    shown = ok_json(*A, "runs", "show", run_id)
    [entry] = shown["audit"]
    assert (entry["action"], entry["actor"], entry["origin"]) == (
        "retry",
        getpass.getuser(),
        socket.gethostname(),
    )
    assert entry["at"].endswith("Z")
    assert entry["details"]["previous_error"]["type"] == "StepFailedError"
    [step] = shown["steps"]
    assert step["args"] == [long_value]
    first, second = step["attempts"]
    assert first["status"] == "failed" and second["status"] == "succeeded"
    assert first["task_id"] and first["task_id"] != second["task_id"]
    assert first["node"] == cliapp.pikku.worker_id  # no Celery worker: the process

    human = cli(*A, "runs", "show", run_id).output
    assert "operator actions" in human and "retry" in human and getpass.getuser() in human
    assert first["task_id"] in human and second["task_id"] in human
    assert "flaky refused" in human  # the earlier failure, still shown
    assert "fragile, fragile" in human and "…" in human and "--full" in human
    assert arguments_of(human).count("fragile") < 30  # cut short...
    full = cli(*A, "runs", "show", run_id, "--full").output
    assert arguments_of(full).count("fragile") == 30  # ...or whole


def arguments_of(text: str) -> str:
    """The arguments table of ``runs show``."""
    return text.split("\narguments", 1)[1].split("\nattempts", 1)[0]


def test_cancel_and_signal_from_the_command_line_are_kept(cliapp: Any) -> None:
    waiting = start(cliapp, "approval")
    drive(cliapp, waiting)
    assert cli(*A, "signal", waiting, "approve", '{"by": "ops"}').exit_code == 0
    doomed = start(cliapp, "approval")
    assert cli(*A, "runs", "cancel", doomed).exit_code == 0
    [signal] = ok_json(*A, "runs", "show", waiting)["audit"]
    assert signal["action"] == "signal" and signal["actor"] == getpass.getuser()
    assert signal["details"] == {"name": "approve", "payload": {"by": "ops"}}
    [cancel] = ok_json(*A, "runs", "show", doomed)["audit"]
    assert (cancel["action"], cancel["origin"]) == ("cancel", socket.gethostname())


def test_runs_list_says_which_runs_wait_for_a_signal(cliapp: Any) -> None:
    waiting = start(cliapp, "approval")
    drive(cliapp, waiting)
    done = start(cliapp, "order", {"a": 1, "b": 2})
    drive(cliapp, done)
    listing = ok_json(*A, "runs", "list")
    by_id = {r["id"]: r for r in listing["runs"]}
    assert by_id[waiting]["waiting"]["for"] == "signal"
    assert by_id[done]["waiting"] is None
    name = by_id[waiting]["waiting"]["name"]
    text = cli(*A, "runs", "list").output
    assert f"waiting for signal {name}" in text
