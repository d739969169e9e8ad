"""``pikku-celery runs events`` and the events table of ``runs show``."""

from __future__ import annotations

import json
from typing import Any

from pikku_celery import Context

from .test_cli import UNKNOWN_RUN, A, cli, cliapp, drive, ok_json

__all__ = ["cliapp"]  # the fixture, shared with test_cli


def _progress_run(app: Any) -> str:
    @app.pikku.workflow(name="progress")
    def progress(ctx: Context, n: int) -> int:
        for i in range(n):
            ctx.step(f"add-{i}", app.add, i, 1)
            ctx.set_event("progress", {"done": i + 1, "of": n})
        ctx.set_event("stage", "[finished]")  # brackets: printed literally, not as markup
        return n

    run_id: str = app.pikku.start("progress", 3).run_id
    drive(app, run_id)
    return run_id


def test_runs_events_lists_a_runs_events_in_order(cliapp: Any) -> None:
    run_id = _progress_run(cliapp)
    shown = ok_json(*A, "runs", "events", run_id)
    assert [(e["key"], e["number"], e["value"]) for e in shown] == [
        ("progress", 0, {"done": 1, "of": 3}),
        ("progress", 1, {"done": 2, "of": 3}),
        ("progress", 2, {"done": 3, "of": 3}),
        ("stage", 0, "[finished]"),
    ]
    assert shown[0]["step"] == "event:progress#0" and shown[0]["at"].endswith("Z")
    only = ok_json(*A, "runs", "events", run_id, "--key", "stage")
    assert [e["value"] for e in only] == ["[finished]"]
    human = cli(*A, "runs", "events", run_id)
    assert human.exit_code == 0, human.output
    assert '{"done": 3, "of": 3}' in human.output and '"[finished]"' in human.output
    # --follow on an ended run prints what it set, then the run's end.
    followed = cli(*A, "runs", "events", run_id, "--follow", "--json")
    lines = [json.loads(line) for line in followed.output.splitlines()]
    assert [e["number"] for e in lines if e["key"] == "progress"] == [0, 1, 2]


def test_runs_show_ends_with_the_events_and_its_json_has_them(cliapp: Any) -> None:
    run_id = _progress_run(cliapp)
    human = cli(*A, "runs", "show", run_id)
    assert human.exit_code == 0, human.output
    assert "events" in human.output and '"[finished]"' in human.output
    assert [e["key"] for e in ok_json(*A, "runs", "show", run_id)["events"]] == [
        "progress",
        "progress",
        "progress",
        "stage",
    ]


def test_runs_events_of_an_unknown_run_says_so(cliapp: Any) -> None:
    result = cli(*A, "runs", "events", UNKNOWN_RUN)
    assert result.exit_code != 0
    assert "no workflow run" in result.output


def test_runs_events_refuses_a_key_no_run_could_set(cliapp: Any) -> None:
    run_id = _progress_run(cliapp)
    result = cli(*A, "runs", "events", run_id, "--key", "x" * 300)
    assert result.exit_code != 0
    assert "event key is 300 characters long" in result.output
