"""A lease lapses when its own expiry passes, whatever the reader's lease setting.

A rolling deploy that lowers the visibility timeout (so the new workers' step
lease is shorter) must not take over a step an old worker still holds and
renews; a lease set further ahead than any worker of the fleet grants (an
edited row, a store clock set back) is still found and taken over.

Old and new fleet are two ``Pikku`` instances on one store, each with its own
embedded SQLite broker: the old one holds the step from a thread while its
body runs; the new one sweeps and tries to claim, as its workers would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from celery import Celery

import pikku_celery.broker  # noqa: F401  (the sqlite-queue:// scheme)
from pikku_celery import Context, Pikku
from pikku_celery.engine.execute import call_with
from pikku_celery.model.values import step_id_for
from pikku_celery.sql.schema import metadata
from pikku_celery.store import AttemptStatus, StepStatus
from tests.helpers import wait_until
from tests.services import MYSQL_ADMIN_URL, PG_ADMIN_URL, SESSION_TAG, scratch_database

TASK = "deploy.work"
OLD_VISIBILITY = 60.0  # the old fleet: a 60 s lease, renewed every 30 s
NEW_VISIBILITY = 6.0  # the new fleet: a 6 s lease
TEN_YEARS_MS = 10 * 365 * 24 * 3600 * 1000


def fleet(
    name: str, database_url: str, broker_dir: Path, visibility: float, **options: Any
) -> Pikku:
    """One release of the app: its own broker file, the shared store."""
    app = Celery(name, broker=f"sqlite-queue:///{broker_dir / name}.db", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": visibility}
    app.conf.task_default_queue = f"deploy-{broker_dir.name}"

    @app.task(name=TASK, shared=False)
    def work() -> str:
        return "unused: the tests run the body themselves"

    pikku = Pikku(
        app, database_url, install_beat=False, eager_steps=False, worker_id=f"{name}:1", **options
    )

    @pikku.workflow(name="deploy.flow")
    def flow(ctx: Context) -> Any:
        return ctx.step("work", TASK, retries=1)

    return pikku


@dataclass
class Held:
    """A step the old fleet claimed and runs until ``release`` is set."""

    old: Pikku
    run_id: str
    step_id: str
    queue: str | None
    release: threading.Event
    thread: threading.Thread
    database_url: str
    broker_dir: Path
    fleets: list[Pikku]

    def new_fleet(self, visibility: float, **options: Any) -> Pikku:
        """The next release's workers, on the same store."""
        pikku = fleet("new", self.database_url, self.broker_dir, visibility, **options)
        self.fleets.append(pikku)
        return pikku

    def finish(self) -> None:
        self.release.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of this test's own: a sweep must find only this test's steps."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    admin = PG_ADMIN_URL if request.param == "postgresql" else MYSQL_ADMIN_URL
    with scratch_database(admin, f"{SESSION_TAG}_deploy{uuid.uuid4().hex[:6]}") as url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(engine)
        engine.dispose()
        yield url


@pytest.fixture
def held(database_url: str, tmp_path: Path) -> Iterator[Held]:
    old = fleet("old", database_url, tmp_path, OLD_VISIBILITY)
    run_id = old.start("deploy.flow").run_id
    step_id = step_id_for(run_id, "work")
    step = old.store.get_step(step_id)
    assert step is not None
    release = threading.Event()

    def body() -> str:
        release.wait(60)
        return "by the old worker"

    thread = threading.Thread(
        target=old.execute_step, args=(run_id, step_id, TASK, call_with(body), step.queue)
    )
    thread.start()
    wait_until(lambda: _status(old, step_id) == (StepStatus.RUNNING, 1), timeout=10)
    h = Held(old, run_id, step_id, step.queue, release, thread, database_url, tmp_path, [old])
    try:
        yield h
    finally:
        release.set()
        thread.join(30)
        for pikku in h.fleets:
            if pikku.sql_engine is not None:
                pikku.sql_engine.dispose()


def _status(pikku: Pikku, step_id: str) -> tuple[StepStatus, int] | None:
    step = pikku.store.get_step(step_id)
    return None if step is None else (step.status, step.attempt)


def _try_to_take(new: Pikku, h: Held) -> Callable[[], Any]:
    """What the new fleet does: a sweep, then a claim as its worker would make
    on the message that sweep sent (or on the original's redelivery)."""

    def attempt() -> Any:
        report = new.sweep()
        taken = new.execute_step(
            h.run_id, h.step_id, TASK, call_with(lambda: "by a new worker"), h.queue
        )
        return report, taken

    return attempt


def test_a_lower_visibility_timeout_does_not_take_over_an_old_workers_live_step(
    held: Held,
) -> None:
    new = held.new_fleet(NEW_VISIBILITY)
    assert held.old.lease_for_queue(held.queue).seconds == 60.0
    assert new.lease_for_queue(held.queue).seconds == 6.0
    step = new.store.get_step(held.step_id)
    assert step is not None and step.lease_expires_at is not None
    # The old worker's lease ends further ahead than twice the new one's.
    assert step.lease_expires_at - new.store.now_ms() > 2 * 6_000
    take = _try_to_take(new, held)
    for _ in range(3):
        report, taken = take()
        assert report.requeued_lapsed == 0 and report.expired == 0, report
        assert taken is None  # the claim found a live lease
    assert _status(new, held.step_id) == (StepStatus.RUNNING, 1)

    held.finish()
    assert new.handle(held.run_id).wait(10) == "by the old worker"
    attempts = [(a.attempt, a.status) for a in new.store.get_attempts(held.run_id)]
    assert attempts == [(1, AttemptStatus.SUCCEEDED)]


def test_a_fleet_that_lowers_both_settings_names_its_longest_lease_with_max_lease(
    held: Held,
) -> None:
    # step_lease and visibility both 6 s: nothing in the new configuration
    # knows of 60 s leases; max_lease says how long a lease the fleet grants.
    new = held.new_fleet(NEW_VISIBILITY, step_lease=6, max_lease=120)
    report, taken = _try_to_take(new, held)()
    assert report.requeued_lapsed == 0 and taken is None
    held.finish()
    assert new.handle(held.run_id).wait(10) == "by the old worker"


def test_a_lease_edited_far_into_the_future_is_taken_over(
    held: Held,
) -> None:
    new = held.new_fleet(NEW_VISIBILITY)
    engine = new.sql_engine
    assert engine is not None
    far = new.store.now_ms() + TEN_YEARS_MS
    with engine.begin() as conn:
        edited = conn.execute(
            sa.text("UPDATE pikku_workflow_step SET lease_expires_at = :far WHERE id = :id"),
            {"far": far, "id": held.step_id},
        ).rowcount
    assert edited == 1
    report, taken = _try_to_take(new, held)()
    assert report.requeued_lapsed == 1, report
    assert taken is not None and taken.attempt == 2
    held.finish()  # its outcome is refused: attempt 2 owns the step
    assert new.handle(held.run_id).wait(10) == "by a new worker"
    attempts = [(a.attempt, a.status) for a in new.store.get_attempts(held.run_id)]
    assert attempts == [(1, AttemptStatus.SUPERSEDED), (2, AttemptStatus.SUCCEEDED)]
