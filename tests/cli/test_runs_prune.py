"""``pikku-celery runs prune`` and the retention ``runs show`` states, as a user runs them."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from tests.cli.test_cli import A, cli, cliapp, drive, ok_json, start

__all__ = ["cliapp"]  # the fixture, shared with test_cli


def settled_runs(app: Any) -> dict[str, str]:
    """Two completed orders, a failed run and one still waiting for a signal."""
    app.FAILING.add("cliapp.flaky")
    runs = {
        "order-1": start(app, "order", {"a": 1, "b": 2}),
        "order-2": start(app, "order", {"a": 3, "b": 4}),
        "fragile": start(app, "fragile", 1),
        "waiting": start(app, "approval"),
    }
    for run_id in runs.values():
        drive(app, run_id)
    statuses = {name: app.pikku.store.get_run(rid).status.value for name, rid in runs.items()}
    assert statuses == {
        "order-1": "completed",
        "order-2": "completed",
        "fragile": "failed",
        "waiting": "running",
    }
    return runs


def listed(app: Any) -> set[str]:
    return {r.id for r in app.pikku.store.list_runs(limit=100)}


def test_a_dry_run_counts_and_changes_nothing(cliapp: Any) -> None:
    runs = settled_runs(cliapp)
    dry = ok_json(*A, "runs", "prune", "--older-than", "0s", "--dry-run")
    assert (dry["dry_run"], dry["runs"], dry["trees"], dry["steps"]) == (True, 3, 3, 5)
    assert listed(cliapp) == set(runs.values())
    assert cliapp.pikku.store.get_attempts(runs["order-1"])
    human = cli(*A, "runs", "prune", "--older-than", "0s", "--dry-run")
    assert human.exit_code == 0, human.output
    assert "would prune 3 run(s) in 3 tree(s)" in human.stdout
    assert listed(cliapp) == set(runs.values())


def test_filters_and_age_choose_what_goes(cliapp: Any) -> None:
    runs = settled_runs(cliapp)
    young = ok_json(*A, "runs", "prune", "--older-than", "1h")
    assert young["runs"] == 0 and young["finished"]
    failed = ok_json(*A, "runs", "prune", "--older-than", "0s", "--status", "failed")
    assert failed["runs"] == 1 and runs["fragile"] not in listed(cliapp)
    human = cli(
        *A, "runs", "prune", "--older-than", "0s", "--workflow", "order", "--batch-size", "1"
    )
    assert human.exit_code == 0, human.output
    assert "pruned 2 run(s) in 2 tree(s): 4 step(s)" in human.stdout
    assert "2 batch(es)" in human.stdout
    assert "2/2" in human.stderr and "run trees looked at" in human.stderr  # the bar
    assert listed(cliapp) == {runs["waiting"]}  # still running: never pruned
    assert ok_json(*A, "runs", "prune", "--older-than", "0s")["runs"] == 0


def test_bad_options_are_refused_before_anything_is_read(cliapp: Any) -> None:
    for args in (("--older-than", "soon"), ("--older-than", "1d", "--status", "running")):
        result = cli(*A, "runs", "prune", *args)
        assert result.exit_code == 2, result.output
    assert cli(*A, "runs", "prune").exit_code == 2  # --older-than is required


def test_runs_show_says_how_long_runs_are_kept(cliapp: Any) -> None:
    run_id = start(cliapp, "order", {"a": 1, "b": 1})
    drive(cliapp, run_id)
    shown = cli(*A, "runs", "show", run_id)
    assert "runs are kept for good (no retention set)" in shown.output
    cliapp.pikku.retention = timedelta(days=30)
    shown = cli(*A, "runs", "show", run_id)
    assert "runs are kept 30 days after they settle" in shown.output


def test_the_database_url_alone_is_enough(cliapp: Any) -> None:
    runs = settled_runs(cliapp)
    url = f"sqlite:///{cliapp.DB_PATH}"
    result = cli("runs", "prune", "--older-than", "0s", "--database-url", url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs"] == 3
    assert listed(cliapp) == {runs["waiting"]}
