"""A real ``celery worker`` (prefork, 2 processes) on the SQLite broker survives SIGKILL."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

import pikku_celery.broker  # noqa: F401
from pikku_celery.broker.sqlite import TABLE
from tests.broker.celery_app import QUEUE
from tests.celery.workers import ROOT, WorkerProcess, worker
from tests.helpers import wait_until

VISIBILITY = 2.0

pytestmark = pytest.mark.slow


def held_rows(db: Path) -> list[tuple[str | None, int]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(f"SELECT delivery_tag, deliveries FROM {TABLE}").fetchall()
    finally:
        conn.close()


def lines(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


class Workers:
    """Starts ``celery worker`` nodes of the SQLite-broker app and always kills them."""

    def __init__(self, tmp_path: Path, db: Path) -> None:
        self.tmp_path = tmp_path
        self.env = {
            "PIKKU_TEST_BROKER_DB": str(db),
            "PIKKU_TEST_VISIBILITY": str(VISIBILITY),
            "PYTHONPATH": str(ROOT),
        }
        self.nodes: list[WorkerProcess] = []

    def start(self, name: str) -> WorkerProcess:
        node = worker(
            self.env,
            [QUEUE],
            self.tmp_path / f"{name}.log",
            name,
            concurrency=2,
            app_module="tests.broker.celery_app",
        )
        self.nodes.append(node)
        return node

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.tmp_path.glob("*.log")))


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    w = Workers(tmp_path, tmp_path / "broker.db")
    try:
        yield w
    finally:
        for node in w.nodes:
            node.kill()


def test_a_task_of_a_sigkilled_worker_is_delivered_again_and_completes(
    tmp_path: Path, workers: Workers
) -> None:
    db = tmp_path / "broker.db"
    publisher = Celery("publisher", broker=f"sqlite-queue:///{db}")
    publisher.conf.task_default_queue = QUEUE
    try:
        publisher.send_task("broker_test.block", args=[str(tmp_path), "job-1"])
    finally:
        publisher.close()

    first = workers.start("first")
    started = tmp_path / "started"
    wait_until(lambda: lines(started), timeout=60)
    [(token, _pid, pgid)] = lines(started)
    assert token == "job-1" and int(pgid) == first.pid  # a pool process of the first worker

    first.kill()  # SIGKILL to the whole group, mid-task: nobody acks
    assert [tag is not None for tag, _ in held_rows(db)] == [True], workers.logs()

    (tmp_path / "release").touch()
    second = workers.start("second")
    done = tmp_path / "done"
    try:
        wait_until(lambda: lines(done), timeout=60)
        wait_until(lambda: not held_rows(db), timeout=30)  # acked: the row is gone
    except AssertionError:
        raise AssertionError(f"task not redelivered\n{workers.logs()}") from None
    [(token, _pid, pgid)] = lines(done)
    assert token == "job-1" and int(pgid) == second.pid
    assert [s[0] for s in lines(started)] == ["job-1", "job-1"]
    assert int(lines(started)[1][2]) == second.pid


def test_a_worker_rides_out_a_broker_file_locked_past_its_busy_timeout(
    tmp_path: Path, workers: Workers
) -> None:
    db = tmp_path / "broker.db"
    publisher = Celery("publisher", broker=f"sqlite-queue:///{db}")
    publisher.conf.task_default_queue = QUEUE
    done = tmp_path / "done"
    workers.env["PIKKU_TEST_BUSY_TIMEOUT"] = "0.2"
    lock = sqlite3.connect(db, isolation_level=None)
    try:
        publisher.send_task("broker_test.mark", args=[str(tmp_path), "before"])
        lock.execute("BEGIN IMMEDIATE")  # SQLite's write lock, held from outside
        node = workers.start("locked")
        wait_until(lambda: "database is locked" in node.log(), timeout=60)
        lock.execute("ROLLBACK")
        wait_until(lambda: lines(done), timeout=60)
        publisher.send_task("broker_test.mark", args=[str(tmp_path), "after"])
        wait_until(lambda: len(lines(done)) == 2, timeout=60)
    except AssertionError:
        raise AssertionError(f"the worker did not recover\n{workers.logs()}") from None
    finally:
        lock.close()
        publisher.close()
    assert [token for token, _pid, pgid in lines(done) if int(pgid) == node.pid] == [
        "before",
        "after",
    ]
    wait_until(lambda: not held_rows(db), timeout=30)
