"""``Pikku(retention=...)``: the ``pikku-prune`` beat entry and the ``pikku.prune`` task.

The task is applied as beat's message would run it, on an SQLite store whose
runs are made through the store; a second prune while one holds the prune
lease stands aside.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from pikku_celery import Pikku
from pikku_celery.celery.retention import PRUNE, PRUNE_BEAT_ENTRY, PRUNE_INTERVAL
from pikku_celery.engine.passes import take_pass
from pikku_celery.engine.prune import PRUNE_LEASE_KEY, describe_retention
from pikku_celery.store import Decision, NewRun, RunStatus
from tests.helpers import wait_until


def make(path: Path, **options: Any) -> Pikku:
    app = Celery("retention", broker="memory://")
    return Pikku(app, f"sqlite:///{path / 'runs.db'}", **options)


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Pikku]:
    pikku = make(tmp_path, retention=timedelta(0))
    yield pikku
    pikku.disconnect_signals()
    pikku.close()


def settled(pikku: Pikku, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        run, _ = pikku.store.create_run(NewRun(workflow="wf", input=1))
        take_pass(
            pikku.store,
            run.id,
            None,
            lambda view: Decision(run_status=RunStatus.COMPLETED, output=1),
        )
        ids.append(run.id)
    now = pikku.store.now_ms()
    wait_until(lambda: pikku.store.now_ms() > now)
    return ids


def test_the_beat_prunes_every_minute_only_with_a_retention(tmp_path: Path) -> None:
    kept = make(tmp_path, retention=timedelta(days=30))
    entry = kept.app.conf.beat_schedule[PRUNE_BEAT_ENTRY]
    assert (entry["task"], entry["schedule"]) == (PRUNE, PRUNE_INTERVAL) == (PRUNE, 60.0)
    assert "pikku-sweep" in kept.app.conf.beat_schedule
    forever = make(tmp_path)
    assert forever.retention is None and PRUNE in forever.app.tasks
    assert PRUNE_BEAT_ENTRY not in forever.app.conf.beat_schedule
    assert forever.prune_task.apply().get() == forever.prune().as_dict()
    assert forever.prune().skipped
    for pikku in (kept, forever):
        pikku.disconnect_signals()
        pikku.close()


def test_a_bad_retention_is_refused_when_pikku_is_built(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="retention"):
        make(tmp_path, retention=timedelta(days=-1))
    with pytest.raises(TypeError, match="timedelta"):
        make(tmp_path, retention=30)


def test_the_task_prunes_settled_runs_under_its_lease(kept: Pikku) -> None:
    old = settled(kept, 3)
    live, _ = kept.store.create_run(NewRun(workflow="wf", input=1))
    report = kept.prune_task.apply().get()
    assert (report["runs"], report["finished"], report["skipped"]) == (3, True, False)
    assert all(kept.store.get_run(r) is None for r in old)
    assert kept.store.get_run(live.id) is not None
    assert kept.leases.get(PRUNE_LEASE_KEY) is None  # released at the end


def test_a_prune_stands_aside_while_another_holds_the_lease(kept: Pikku) -> None:
    old = settled(kept, 2)
    other = kept.leases.acquire(PRUNE_LEASE_KEY, "another-beat", 60)
    assert other is not None
    assert kept.prune_task.apply().get()["skipped"] is True
    assert all(kept.store.get_run(r) is not None for r in old)
    kept.leases.release(other)
    assert kept.prune_task.apply().get()["runs"] == 2


def test_the_retention_is_said_in_words() -> None:
    assert describe_retention(None) == "runs are kept for good (no retention set)"
    assert describe_retention(timedelta(days=1)) == "runs are kept 1 day after they settle"
    assert describe_retention(timedelta(hours=36)) == "runs are kept 36 hours after they settle"
    assert describe_retention(timedelta(seconds=90)) == "runs are kept 90 seconds after they settle"
