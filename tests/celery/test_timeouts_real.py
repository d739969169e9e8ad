"""Step timeouts, task time limits and run deadlines on a real ``celery
worker`` (prefork) and ``celery beat``, Redis broker, SQLite file store.

The hanging bodies are plain ``while True: time.sleep(1)`` loops running as
*eager* steps (inside the message of the step before them), which Celery's
own per-message time limits cannot reach. The three runs start together on
one worker (their hung bodies hold a process each), then each test checks
its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pikku_celery.errors import WorkflowDeadlineError
from pikku_celery.model.values import BROKER, EAGER
from pikku_celery.store import AttemptStatus, RunStatus, StepStatus
from tests.helpers import LONG, long_form, wait_until
from tests.services import SESSION_TAG, reachable_redis

from . import realapp
from .workers import CeleryProcess, beat, worker

pytestmark = pytest.mark.slow

BROKER_REDIS_DB = 9  # every key under this session's prefix, deleted afterwards
VISIBILITY = 10.0  # the step lease (min(visibility, step_lease))
STEP_TIMEOUT = 3.0  # to.step_timeout's ctx.step(timeout=)
SWEEP = 1.0


@dataclass
class Cluster:
    env: dict[str, str]
    workdir: Path
    app: realapp.TestApp
    nodes: list[CeleryProcess] = field(default_factory=list)

    def logs(self) -> str:
        return "\n".join(f"--- {n.log_path.name}\n{n.log()[-4000:]}" for n in self.nodes)

    def waited(self, run: Any, timeout: float = 60) -> Any:
        try:
            return run.wait(timeout=timeout)
        except Exception:
            print(self.logs())
            raise


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("timeouts")
    url, client = reachable_redis(BROKER_REDIS_DB)
    env = {
        "PIKKU_T_BROKER": url,
        "PIKKU_T_DATABASE": f"sqlite:///{workdir / 'store.db'}",
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-to",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": str(SWEEP),
        "PIKKU_T_MARKS": str(workdir),
        "PIKKU_T_EXTRA": "tests.celery.timeout_flows",
        "PIKKU_T_KEYPREFIX": f"{SESSION_TAG}-to:",
    }
    app = realapp.build(env)
    app.pikku.store.prepare()  # type: ignore[attr-defined]
    c = Cluster(env, workdir, app)
    try:
        c.nodes.append(beat(env, workdir))
        name = f"to-{SESSION_TAG}"
        # hung bodies hold their process: one each, and more for the passes
        c.nodes.append(worker(env, app.queues, workdir / f"{name}.log", name, 6).wait_ready())
        yield c
    finally:
        for node in c.nodes:
            node.kill()
        for key in client.scan_iter(f"{SESSION_TAG}-to:*"):
            client.delete(key)
        assert app.pikku.sql_engine is not None
        app.pikku.sql_engine.dispose()


@pytest.fixture(scope="module")
def runs(cluster: Cluster) -> dict[str, Any]:
    """The three runs, started at once."""
    pikku = cluster.app.pikku
    long = {"blocked": pikku.start("to.blocked", "blocked")} if LONG else {}
    return {
        **long,
        "hung": pikku.start("to.step_timeout", "hung"),
        "limits": pikku.start("to.task_limits", "limits"),
        "deadline": pikku.start("to.deadline", "deadline", timeout=4),
    }


def attempts(run: Any) -> dict[str, list[Any]]:
    return {h.step.name: h.attempts for h in run.steps()}


def test_a_hung_eager_step_fails_its_attempt_at_its_timeout_and_retries(
    cluster: Cluster, runs: dict[str, Any]
) -> None:
    run = runs["hung"]
    assert cluster.waited(run) == [1, "second hung"]
    hung = attempts(run)["hung"]
    assert (hung[0].dispatch, hung[0].status) == (EAGER, AttemptStatus.FAILED)
    assert hung[1].status == AttemptStatus.SUCCEEDED
    first = hung[0]
    assert first.error is not None and first.error["type"] == "WorkflowStepTimeoutError"
    assert first.finished_at is not None
    took = (first.finished_at - first.started_at) / 1000
    print(f"hung eager step: attempt 1 ended {took:.2f} s after it started (timeout 3 s)")
    assert STEP_TIMEOUT <= took <= VISIBILITY + STEP_TIMEOUT


def test_a_tasks_time_limits_are_enforced_on_an_eager_step(
    cluster: Cluster, runs: dict[str, Any]
) -> None:
    run = runs["limits"]
    assert cluster.waited(run) == [1, "cleaned up limits", "second limits"]
    seen = attempts(run)
    # the soft limit was raised in the body, which cleaned up and returned
    assert [(a.dispatch, a.status) for a in seen["soft"]] == [(EAGER, AttemptStatus.SUCCEEDED)]
    hard = seen["hard"]
    assert (hard[0].dispatch, hard[0].status) == (EAGER, AttemptStatus.FAILED)
    assert hard[0].error is not None and hard[0].error["type"] == "WorkflowStepTimeoutError"
    assert hard[0].finished_at is not None and hard[0].finished_at - hard[0].started_at >= 2000
    # the retry, counted against retries=1, travels as a message with Celery's limits
    assert (hard[1].dispatch, hard[1].status) == (BROKER, AttemptStatus.SUCCEEDED)


def test_a_run_deadline_fails_the_run_closes_its_steps_and_stops_its_children(
    cluster: Cluster, runs: dict[str, Any]
) -> None:
    run = runs["deadline"]
    for mark in ("deadline-slow", "deadline-kid"):
        wait_until((cluster.workdir / f"{mark}.started").exists, timeout=30)
    with pytest.raises(WorkflowDeadlineError):
        cluster.waited(run, timeout=30)
    state = run.state()
    assert state.error is not None and state.error["type"] == "WorkflowDeadlineError"
    late = state.updated_at - (state.deadline_at or 0)
    print(f"run deadline: failed {late} ms after its deadline")
    steps = {h.step.name: h for h in run.steps()}
    slow = steps["slow"]
    assert slow.step.status == StepStatus.FAILED
    assert [a.status for a in slow.attempts] == [AttemptStatus.CANCELLED]
    kid_id = steps["kid"].step.child_run_id
    assert kid_id is not None
    kid = cluster.app.pikku.store.get_run(kid_id)
    wait_until(
        lambda: (cluster.app.pikku.store.get_run(kid_id) or kid).status == RunStatus.CANCELLED,
        timeout=30,
    )
    kid_steps = cluster.app.pikku.store.get_steps(kid_id)
    assert [s.status for s in kid_steps] == [StepStatus.FAILED]


@long_form("a lease of 10 s waited out")
def test_long_a_body_blocked_in_c_loses_its_lease_at_its_timeout_and_is_taken_over(
    cluster: Cluster, runs: dict[str, Any]
) -> None:
    """No interrupt reaches a body blocked in C code: its lease is not renewed
    past its timeout, lapses, and the sweep hands the step to attempt 2."""
    run = runs["blocked"]
    assert cluster.waited(run, timeout=90) == [1, "second blocked"]
    first, second = attempts(run)["blocked"]
    assert (first.dispatch, first.status) == (EAGER, AttemptStatus.SUPERSEDED)
    assert second.status == AttemptStatus.SUCCEEDED
    assert first.renewals == 0  # its first renewal was due after its timeout
    took = (second.started_at - first.started_at) / 1000
    print(f"blocked eager step: attempt 2 took over {took:.2f} s after attempt 1 started")
    assert took <= VISIBILITY + 2 * SWEEP + 3
