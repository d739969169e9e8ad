"""``runs cancel|retry`` with a filter: every picked run acted on, with a
progress bar, each audited as a single action; ``--dry-run`` changes nothing."""

from __future__ import annotations

import getpass
from typing import Any

from pikku_celery import RunStatus
from tests.cli.test_cli import A, cli, cliapp, ok_json, start

__all__ = ["cliapp"]  # the fixture, shared with test_cli

MANY = 1000


def statuses(app: Any, workflow: str) -> dict[RunStatus, int]:
    counts: dict[RunStatus, int] = {}
    for run in app.pikku.store.list_runs(workflow=workflow, limit=MANY + 10):
        counts[run.status] = counts.get(run.status, 0) + 1
    return counts


def test_a_thousand_failed_runs_retried_by_filter_with_a_progress_bar(cliapp: Any) -> None:
    pikku = cliapp.pikku
    for n in range(MANY):
        pikku.start("broken", n)
    done = start(cliapp, "order", {"a": 1, "b": 2})  # another workflow: not picked
    assert statuses(cliapp, "broken") == {RunStatus.FAILED: MANY}

    dry = ok_json(*A, "runs", "retry", "--workflow", "broken", "--dry-run")
    assert dry["dry_run"] and dry["picked"] == MANY and len(dry["done"]) == MANY
    assert statuses(cliapp, "broken") == {RunStatus.FAILED: MANY}  # nothing changed
    assert all(not pikku.store.audit_trail(r) for r in dry["done"][:50])
    human = cli(*A, "runs", "retry", "--workflow", "broken", "--dry-run").output
    assert f"dry run: {MANY} run(s) would be retried; nothing changed" in human
    assert "... and 980 more" in human

    result = cli(*A, "runs", "retry", "--workflow", "broken", "--since", "1h")
    assert result.exit_code == 0, result.output
    assert f"retry: {MANY} of {MANY} run(s) done" in result.stdout
    assert f"{MANY}/{MANY}" in result.stderr and "retry runs" in result.stderr  # the bar
    assert statuses(cliapp, "broken") == {RunStatus.RUNNING: MANY}
    some = pikku.store.list_runs(workflow="broken", limit=3)
    for run in some:
        [entry] = pikku.store.audit_trail(run.id)
        assert (entry.action, entry.actor) == ("retry", getpass.getuser())
        assert entry.details["previous_error"]["type"] == "ValueError"
    assert pikku.store.audit_trail(done) == []  # another workflow: not picked

    again = ok_json(*A, "runs", "retry", "--workflow", "broken")
    assert again["picked"] == 0  # what was retried is no longer failed


def test_bulk_cancel_picks_live_runs_only(cliapp: Any) -> None:
    waiting = [start(cliapp, "approval") for _ in range(3)]
    failed = start(cliapp, "broken", 1)
    shown = ok_json(*A, "runs", "cancel", "--status", "running")
    assert sorted(shown["done"]) == sorted(waiting) and shown["refused"] == {}
    for run_id in waiting:
        run = cliapp.pikku.store.get_run(run_id)
        assert run.cancel_requested
        [entry] = cliapp.pikku.store.audit_trail(run_id)
        assert entry.action == "cancel"
    assert not cliapp.pikku.store.get_run(failed).cancel_requested
    again = ok_json(*A, "runs", "cancel", "--status", "running")
    assert again["picked"] == 0  # cancel already requested: not asked twice


def test_bulk_usage_errors(cliapp: Any) -> None:
    run_id = start(cliapp, "broken", 1)
    nothing = cli(*A, "runs", "retry")
    assert nothing.exit_code == 2 and "needs a RUN, or a filter" in nothing.output
    both = cli(*A, "runs", "retry", run_id, "--workflow", "broken")
    assert both.exit_code == 2 and "not both" in both.output
    wrong = cli(*A, "runs", "retry", "--status", "completed")
    assert wrong.exit_code == 2 and "acts on runs that are failed" in wrong.output
