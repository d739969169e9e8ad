"""Workflows are found wherever Celery finds tasks: ``include=`` and
``autodiscover_tasks``, though nothing else imports their modules.

Each project (:mod:`tests.cli.include_app`, :mod:`tests.cli.discover_app`)
is imported fresh, as a process that is not a worker has it: its app module
only. The CLI, start-by-name and the deploy check then import what ``celery
worker`` would. A real worker of the include-only project runs a run to the
end, and the deploy check of a separate ``pikku-celery`` process passes.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pikku_celery import Pikku, RunStatus
from pikku_celery.errors import UnknownWorkflowError
from pikku_celery.model.values import NewRun
from tests.celery.workers import worker
from tests.cli.test_cli import cli

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Project:
    package: str  # what -A names
    workflows_module: str  # where its workflows are, imported only by Celery's loader
    workflow: str  # one taking input
    input: Any
    output: Any
    waiting: str  # one that waits for a signal
    task: str  # a task of the workflows' module
    pikku: Pikku


PROJECTS = {
    "include": ("tests.cli.include_app", "flows", "include_app.total", {"a": 2, "b": 3}, 10,
                "include_app.approval", "include_app.add"),
    "autodiscover": ("tests.cli.discover_app", "billing.tasks", "billing.bill", 250,
                     "invoice for 250", "billing.approval", "billing.invoice"),
}  # fmt: skip


def forget(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def fresh_project(key: str) -> Project:
    package, flows, workflow, data, output, waiting, task = PROJECTS[key]
    forget(package)
    module = importlib.import_module(f"{package}.celery")
    return Project(package, f"{package}.{flows}", workflow, data, output, waiting, task,
                   module.pikku)  # fmt: skip


def let_go(project: Project) -> None:
    project.pikku.disconnect_signals()
    project.pikku.close()
    forget(project.package)


@pytest.fixture(params=sorted(PROJECTS))
def project(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Project]:
    monkeypatch.setenv("PIKKU_LOAD_TEST_DB", str(tmp_path / "store.db"))
    monkeypatch.delenv("PIKKU_LOAD_TEST_BROKER", raising=False)
    monkeypatch.delenv("PIKKU_APP", raising=False)
    monkeypatch.delenv("PIKKU_DATABASE_URL", raising=False)
    found = fresh_project(request.param)
    assert found.workflows_module not in sys.modules
    yield found
    let_go(found)


def in_flight(project: Project, workflow: str, data: Any = None) -> str:
    """A run in flight, recorded through the store (no workflow looked up)."""
    run, _ = project.pikku.store.create_run(NewRun(workflow=workflow, input=data))
    return str(run.id)


def test_leases_lists_the_tasks_celery_finds(project: Project) -> None:
    result = cli("-A", project.package, "leases", "--json")
    assert result.exit_code == 0, result.output
    tasks = {t for q in json.loads(result.stdout)["queues"] for t in q["tasks"]}
    assert project.task in tasks
    assert project.workflows_module in sys.modules


def test_check_deploy_replays_runs_of_workflows_celery_finds(project: Project) -> None:
    ids = {in_flight(project, project.workflow, project.input), in_flight(project, project.waiting)}
    result = cli("-A", project.package, "runs", "check-deploy", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["ok"], report["checked"], report["would_fail"]) == (True, 2, 0)
    assert {v["workflow"] for v in report["versions"]} == {project.workflow, project.waiting}
    assert len(ids) == 2


def test_start_by_name_finds_a_workflow_celery_finds(project: Project) -> None:
    run = project.pikku.start(project.waiting)
    assert project.workflows_module in sys.modules
    assert run.status() is RunStatus.RUNNING
    assert project.pikku.registry.get(project.workflow).name == project.workflow


def test_a_workflow_still_unknown_is_an_error_naming_it_and_where(project: Project) -> None:
    in_flight(project, project.waiting)
    in_flight(project, "retired.flow", 1)
    result = cli("-A", project.package, "runs", "check-deploy")
    assert result.exit_code == 2, result.output
    assert "'retired.flow' (1 run(s))" in result.output
    assert project.package in result.output and "autodiscover_tasks" in result.output
    assert "blocked" not in result.output
    with pytest.raises(UnknownWorkflowError, match=r"'retired\.flow'.*looked in the modules"):
        project.pikku.start("retired.flow")


def pikku_celery(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console command in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "pikku_celery.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_real_worker_runs_an_include_only_workflow_and_the_deploy_check_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        **os.environ,
        "PIKKU_LOAD_TEST_DB": str(tmp_path / "store.db"),
        "PIKKU_LOAD_TEST_BROKER": f"sqlite-queue:///{tmp_path / 'broker.db'}",
        "PYTHONPATH": str(ROOT),
    }
    for key in ("PIKKU_LOAD_TEST_DB", "PIKKU_LOAD_TEST_BROKER"):
        monkeypatch.setenv(key, env[key])
    project = fresh_project("include")
    node = worker(env, ["celery"], tmp_path / "worker.log", "include", app_module=project.package)
    try:
        node.wait_ready(60)
        done = project.pikku.start(project.workflow, project.input)
        assert done.wait(timeout=60) == project.output, node.log()
        waiting = project.pikku.start(project.waiting)  # in flight while the check runs
        assert waiting.status() is RunStatus.RUNNING

        checked = pikku_celery("-A", project.package, "runs", "check-deploy", "--json", env=env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        report = json.loads(checked.stdout)
        assert (report["ok"], report["checked"]) == (True, 1)

        listed = pikku_celery("-A", project.package, "leases", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert project.task in {t for q in json.loads(listed.stdout)["queues"] for t in q["tasks"]}

        waiting.signal("approve", "yes")
        assert waiting.wait(timeout=60) == "yes", node.log()
    finally:
        node.stop()
        let_go(project)
