"""``/metrics``: Prometheus' text format, counted from the store.

Every worker process writes its attempts to the store, so the counts a
scrape reads there are every process's (a prefork pool's children included):
after a known set of runs they equal the rows, run for run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from pikku_celery import Pikku
from pikku_celery.contrib.flask import make_blueprint
from pikku_celery.store import AttemptStatus, RunStatus, StepStatus
from tests.helpers import wait_until

from . import webapp

SUCCEEDED, FAILED, TAKEOVERS = 4, 2, 3


@pytest.fixture(params=["memory", "sqlite"])
def pikku(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pikku]:
    url = None if request.param == "memory" else f"sqlite:///{tmp_path / 'metrics.db'}"
    made = webapp.build(url, name="metrics")
    yield made
    if made.sql_engine is not None:
        made.sql_engine.dispose()


def scrape(pikku: Pikku, allow: bool = True) -> tuple[int, dict[tuple[str, str], float]]:
    app = Flask(__name__)
    hook = lambda action, target: allow  # noqa: E731
    app.register_blueprint(make_blueprint(pikku, permission=hook, run_page=True), url_prefix="/p")
    answer = app.test_client().get("/p/metrics")
    if answer.status_code != 200:
        return answer.status_code, {}
    samples: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(answer.get_data(as_text=True)):
        for sample in family.samples:
            label = sample.labels.get("status", sample.labels.get("queue", ""))
            samples[(sample.name, label)] = sample.value
    return answer.status_code, samples


def taken_over(pikku: Pikku) -> str:
    """An order whose first step's claim lapses (its worker gone) and is taken over."""
    run_id = pikku.start(webapp.RETRIES, {"a": 1, "b": 2}).run_id
    [step] = webapp.due_steps(pikku, run_id)
    assert step.task_name is not None
    ghost = pikku.store.claim_step(step.id, step.task_name, "ghost:1", 20, run_id=run_id)
    assert ghost is not None and ghost.lease_expires_at is not None
    wait_until(lambda: pikku.store.now_ms() > (ghost.lease_expires_at or 0))
    webapp.run_step(pikku, step)  # attempt 2 takes the lapsed step over
    webapp.drive(pikku, run_id)
    return run_id


def test_the_scrape_counts_what_the_store_holds(pikku: Pikku) -> None:
    done = [pikku.start(webapp.ORDER, {"a": i, "b": 1}).run_id for i in range(SUCCEEDED)]
    failed = [pikku.start(webapp.FAILS, i).run_id for i in range(FAILED)]
    webapp.drive(pikku, *done, *failed)
    for _ in range(TAKEOVERS):
        taken_over(pikku)
    waiting = pikku.start(webapp.ORDER, {"a": 0, "b": 0}).run_id  # its first step unclaimed

    status, samples = scrape(pikku)
    assert status == 200
    store = pikku.store
    runs = store.count_runs_by_status()
    assert runs[RunStatus.COMPLETED] == SUCCEEDED + TAKEOVERS
    assert runs[RunStatus.FAILED] == FAILED
    for run_status, n in runs.items():
        assert samples[("pikku_runs", run_status.value)] == n
    for step_status, n in store.count_steps_by_status().items():
        assert samples[("pikku_steps", step_status.value)] == n
    attempts = store.count_attempts_by_status()
    assert attempts[AttemptStatus.SUPERSEDED] == TAKEOVERS
    assert attempts[AttemptStatus.FAILED] == FAILED
    for attempt_status, n in attempts.items():
        assert samples[("pikku_step_attempts_total", attempt_status.value)] == n
    # The step nobody claimed yet, on its queue.
    assert [s.status for s in webapp.due_steps(pikku, waiting)] == [StepStatus.SCHEDULED]
    assert samples[("pikku_unclaimed_steps", "celery")] == 1
    assert samples[("pikku_oldest_unclaimed_step_seconds", "celery")] >= 0


def test_the_scrape_asks_the_permission_hook(pikku: Pikku) -> None:
    status, _ = scrape(pikku, allow=False)
    assert status == 403
