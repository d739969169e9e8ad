"""Deploying changed workflow code under runs in flight, on real workers.

Redis broker, PostgreSQL store. A run is started on the old code and left
waiting for a signal after steps a, b and c; the workers are stopped and
started again on changed code (``PIKKU_T_FLOW_CODE``, read by
:mod:`tests.celery.versioned_flows`): ``x`` inserted before ``b``, ``b``
renamed ``b2``, ``c`` removed. Then the old run is let go and a new run is
started on the new code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from pikku_celery import RunStatus, WorkflowFailedError
from pikku_celery.sql.schema import metadata
from tests.helpers import wait_until
from tests.services import SESSION_TAG, reachable_redis

from . import realapp
from .versioned_flows import PINNED, VERSIONED
from .workers import CeleryProcess, beat, worker

pytestmark = pytest.mark.slow

BROKER_REDIS_DB = 12  # this module's own: its queues are deleted afterwards
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Deploy:
    """A Redis + PostgreSQL deployment whose code changes between worker restarts."""

    env: dict[str, str]
    workdir: Path
    apps: list[realapp.TestApp] = field(default_factory=list)
    workers: list[CeleryProcess] = field(default_factory=list)
    beat: CeleryProcess | None = None

    def code(self, code: str) -> realapp.TestApp:
        """This process's app on ``code`` (as a web process after the deploy)."""
        app = realapp.build({**self.env, "PIKKU_T_FLOW_CODE": code})
        self.apps.append(app)
        return app

    def start_workers(self, code: str) -> None:
        """Stop the running worker, start one on ``code`` (a deploy)."""
        for w in self.workers:
            w.stop()
        name = f"v{len(self.workers)}-{SESSION_TAG}"
        env = {**self.env, "PIKKU_T_FLOW_CODE": code}
        started = worker(env, self.apps[0].queues, self.workdir / f"{name}.log", name)
        self.workers.append(started.wait_ready())

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log()[-3000:]}" for w in self.workers)


@pytest.fixture
def deploy(postgres_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Deploy]:
    url, _ = reachable_redis(BROKER_REDIS_DB)
    engine = sa.create_engine(postgres_url)
    metadata.create_all(engine)
    engine.dispose()
    env = {
        "PIKKU_T_BROKER": url,
        "PIKKU_T_DATABASE": postgres_url,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-ver-{request.node.name[5:25]}",
        "PIKKU_T_VISIBILITY": "5",
        "PIKKU_T_SWEEP": "1",
        "PIKKU_T_MARKS": str(tmp_path),
    }
    d = Deploy(env, tmp_path)
    d.code("old")
    try:
        d.beat = beat(env, tmp_path)
        yield d
    finally:
        for w in d.workers:
            w.stop()
        if d.beat is not None:
            d.beat.stop()
        client = redis.Redis.from_url(url)
        for q in d.apps[0].queues:
            client.delete(q)
        for app in d.apps:
            assert app.pikku.sql_engine is not None
            app.pikku.sql_engine.dispose()


def parked(app: realapp.TestApp, run_id: str, deploy: Deploy) -> list[str]:
    """Wait until the run waits for its signal; its step names."""

    def waiting() -> list[str] | None:
        names = [h.step.name for h in app.pikku.handle(run_id).steps()]
        return names if "signal:go" in names else None

    try:
        return wait_until(waiting, timeout=60, interval=0.1)
    except AssertionError:
        raise AssertionError(f"run {run_id} never reached its signal:\n{deploy.logs()}") from None


def finished(app: realapp.TestApp, run_id: str) -> Any:
    app.pikku.send_signal(run_id, "go")
    return app.pikku.handle(run_id).wait(timeout=60)


def steps(app: realapp.TestApp, run_id: str) -> list[str]:
    return [h.step.name for h in app.pikku.handle(run_id).steps()]


def test_patched_code_finishes_the_old_run_on_its_path_and_a_new_run_on_the_new(
    deploy: Deploy,
) -> None:
    old = deploy.apps[0]
    deploy.start_workers("old")
    old_run = old.pikku.start(VERSIONED).run_id
    assert parked(old, old_run, deploy) == ["a", "b", "c", "signal:go"]

    deploy.start_workers("patched")
    new = deploy.code("patched")
    new_run = new.pikku.start(VERSIONED).run_id
    assert parked(new, new_run, deploy)[-1] == "signal:go"
    assert finished(new, old_run) == ["a", "b", "c", "d"]
    assert finished(new, new_run) == ["a", "x", "b2", "d"]
    assert steps(new, old_run) == ["a", "b", "c", "signal:go", "d"]
    assert steps(new, new_run) == [
        "a",
        "patch:insert-x",
        "x",
        "patch:rename-b",
        "b2",
        "patch:remove-c",
        "signal:go",
        "d",
    ]
    versions = {new.pikku.handle(r).state().workflow_version for r in (old_run, new_run)}
    assert versions == {
        old.pikku.registry.get(VERSIONED).version,
        new.pikku.registry.get(VERSIONED).version,
    }
    assert len(versions) == 2


def test_both_versions_registered_each_run_finishes_on_its_own(deploy: Deploy) -> None:
    old = deploy.code("pinned-old")
    deploy.start_workers("pinned-old")
    old_run = old.pikku.start(PINNED).run_id
    assert parked(old, old_run, deploy) == ["a", "b", "c", "signal:go"]

    deploy.start_workers("pinned-both")
    both = deploy.code("pinned-both")
    new_run = both.pikku.start(PINNED).run_id
    assert parked(both, new_run, deploy) == ["a", "x", "b2", "signal:go"]
    assert finished(both, old_run) == ["a", "b", "c", "d"]
    assert finished(both, new_run) == ["a", "x", "b2", "d"]
    assert [both.pikku.handle(r).state().workflow_version for r in (old_run, new_run)] == [
        "1",
        "2",
    ]


def test_a_worker_without_a_run_s_version_leaves_it_to_one_that_has_it(deploy: Deploy) -> None:
    old = deploy.code("pinned-old")
    deploy.start_workers("pinned-old")
    old_run = old.pikku.start(PINNED).run_id
    parked(old, old_run, deploy)

    deploy.start_workers("pinned-new")  # a worker with version 2 only
    old.pikku.send_signal(old_run, "go")

    def blocked() -> str | None:
        reason = old.pikku.handle(old_run).state().blocked
        return reason if reason and "version '1'" in reason else None

    reason = wait_until(blocked, timeout=60, interval=0.1)
    assert "which this worker does not have" in reason  # what `runs show` tells the operator
    assert steps(old, old_run) == ["a", "b", "c", "signal:go"]  # nothing replayed there
    assert old.pikku.handle(old_run).status() == RunStatus.RUNNING

    deploy.start_workers("pinned-old")  # a worker that has version 1 comes back
    assert old.pikku.handle(old_run).wait(timeout=60) == ["a", "b", "c", "d"]
    assert old.pikku.handle(old_run).state().blocked is None


def test_an_old_worker_leaves_a_run_of_the_patched_code_to_a_newer_one(deploy: Deploy) -> None:
    """A rolling deploy seen from behind: a run the patched code started
    reaches a worker still on the old code, which leaves it blocked."""
    patched = deploy.code("patched")
    deploy.start_workers("patched")
    run_id = patched.pikku.start(VERSIONED).run_id
    assert parked(patched, run_id, deploy)[:2] == ["a", "patch:insert-x"]

    deploy.start_workers("old")  # a worker not yet on the new code
    patched.pikku.send_signal(run_id, "go")

    def blocked() -> str | None:
        reason = patched.pikku.handle(run_id).state().blocked
        return reason if reason and "patch:insert-x" in reason else None

    wait_until(blocked, timeout=60, interval=0.1)
    assert patched.pikku.handle(run_id).status() == RunStatus.RUNNING
    deploy.start_workers("patched")
    assert patched.pikku.handle(run_id).wait(timeout=60) == ["a", "x", "b2", "d"]


def check_deploy(env: dict[str, str], code: str, database_url: str) -> tuple[int, Any]:
    """``pikku-celery -A tests.celery.realapp runs check-deploy --json`` on ``code``."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pikku_celery.cli",
            "-A",
            "tests.celery.realapp",
            "runs",
            "check-deploy",
            "--json",
            "--workflow",
            VERSIONED,
            "--database-url",
            database_url,
        ],
        cwd=ROOT,
        env={**os.environ, **env, "PIKKU_T_FLOW_CODE": code},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_without_either_the_check_lists_the_run_and_the_deploy_fails_it(deploy: Deploy) -> None:
    old = deploy.apps[0]
    deploy.start_workers("old")
    old_run = old.pikku.start(VERSIONED).run_id
    parked(old, old_run, deploy)
    url = deploy.env["PIKKU_T_DATABASE"]

    code, report = check_deploy(deploy.env, "new", url)  # before the deploy
    assert code == 1 and not report["ok"]
    [listed] = [r for r in report["runs"] if r["run_id"] == old_run]
    assert listed["problem"] == "diverges"
    assert listed["step"] == {
        "index": 1,
        "recorded": {"kind": "task", "name": "b"},
        "reached": {"kind": "task", "name": "x"},
    }
    assert check_deploy(deploy.env, "patched", url)[0] == 0  # the patched code would pass
    assert steps(old, old_run) == ["a", "b", "c", "signal:go"]  # the check wrote nothing

    deploy.start_workers("new")
    new = deploy.code("new")
    with pytest.raises(WorkflowFailedError) as failed:
        finished(new, old_run)
    error = failed.value.error or {}
    assert error["type"] == "WorkflowNondeterminismError"
    assert "'x'" in error["message"] and "'b'" in error["message"], error["message"]
    assert new.pikku.handle(old_run).status() == RunStatus.FAILED
    new_run = new.pikku.start(VERSIONED).run_id
    parked(new, new_run, deploy)
    assert finished(new, new_run) == ["a", "x", "b2", "d"]
