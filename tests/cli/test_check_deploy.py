"""``pikku-celery runs check-deploy`` and the version in ``runs list`` / ``runs show``.

A run "started on older code" is one whose history the test app's body no
longer reaches: recorded through the store as an older body would have.
"""

from __future__ import annotations

import json
from typing import Any

from pikku_celery.engine.passes import take_pass
from pikku_celery.model.values import Decision, NewRun, NewStep, StepKind
from tests.cli.test_cli import A, cli, cliapp, ok_json, other  # noqa: F401 - fixtures


def started_on_older_code(app: Any) -> str:
    """A run of ``order`` whose first step was recorded as ``old-add``."""
    store = app.pikku.store
    run, _ = store.create_run(NewRun(workflow="order", input={"a": 1, "b": 2}))
    old = NewStep("old-add", 0, StepKind.TASK, task_name="cliapp.add", args=[1, 2])
    take_pass(store, run.id, None, lambda view: Decision(new_steps=[old]))
    return str(run.id)


def test_check_deploy_lists_the_run_that_would_fail_and_where(cliapp: Any) -> None:  # noqa: F811
    stale = started_on_older_code(cliapp)
    waiting = cliapp.pikku.start("approval").run_id  # replays on this code: not listed
    result = cli(*A, "runs", "check-deploy", "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert (report["ok"], report["checked"], report["would_fail"]) == (False, 2, 1)
    [found] = report["runs"]
    assert found["run_id"] == stale and found["problem"] == "diverges"
    assert found["step"] == {
        "index": 0,
        "recorded": {"kind": "task", "name": "old-add"},
        "reached": {"kind": "task", "name": "add"},
    }
    assert found["error"]["type"] == "WorkflowNondeterminismError"
    assert found["version"] is None  # recorded through the store with none
    by_workflow = {v["workflow"]: v for v in report["versions"]}
    assert by_workflow["order"]["would_fail"] == 1
    approval = cliapp.pikku.registry.get("approval").version
    assert by_workflow["approval"] == {
        "workflow": "approval",
        "version": approval,
        "runs": 1,
        "would_fail": 0,
    }

    human = cli(*A, "runs", "check-deploy")
    assert human.exit_code == 1
    assert all(fact in human.output for fact in (stale, "diverges", "#0", "old-add", "'add'"))
    assert waiting not in human.output.split("runs in flight by version")[0]
    only_approval = ok_json(*A, "runs", "check-deploy", "--workflow", "approval")
    assert only_approval["ok"] and only_approval["checked"] == 1
    # Nothing was written: the run is where it was.
    assert [s.name for s in cliapp.pikku.store.get_steps(stale)] == ["old-add"]


def test_check_deploy_reads_the_database_url(cliapp: Any, other: Any) -> None:  # noqa: F811
    started_on_older_code(cliapp)  # in the app's database, not in the URL's
    other.pikku.start("approval")
    report = ok_json(*A, "runs", "check-deploy", "--database-url", other.url)
    assert report["ok"] and report["checked"] == 1
    needs_app = cli("runs", "check-deploy", "--database-url", other.url)
    assert needs_app.exit_code == 2 and "-A" in needs_app.output


def test_runs_list_and_show_give_each_run_s_version(cliapp: Any) -> None:  # noqa: F811
    run_id = cliapp.pikku.start("approval").run_id
    version = cliapp.pikku.registry.get("approval").version
    assert version.startswith("src:")
    [listed] = ok_json(*A, "runs", "list")["runs"]
    assert listed["workflow_version"] == version
    assert ok_json(*A, "runs", "show", run_id)["run"]["workflow_version"] == version
    assert version[:12] in cli(*A, "runs", "list").output  # a hash shortened in the table
    assert version in cli(*A, "runs", "show", run_id).output
