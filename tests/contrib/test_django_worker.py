"""The example Django site end to end: start on commit, a real worker, the status page.

A real ``celery worker`` (prefork, 2 processes; a local worker node) runs the
shop on the embedded default (SQLite store, SQLite-file broker) under a scratch
``PIKKU_DEMO_HOME``.
The site itself is driven with Django's test client in a subprocess
(``tests/contrib/django_site_client.py``): its settings module cannot share
this process with the settings ``test_django.py`` configures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import create_sqlite_engine
from pikku_celery.sql.schema import run_table
from tests.celery.workers import WorkerProcess, worker

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def start_worker(env: dict[str, str], log: Path) -> WorkerProcess:
    """``celery -A example_project.app worker`` (prefork, 2 processes), as a local node."""
    return worker(
        env,
        ["celery", "shipping"],
        log,
        "django-site",
        concurrency=2,
        app_module="example_project.app",
    )


def top_level_runs(home: Path) -> list[dict[str, Any]]:
    """The shop store's top-level runs, read straight from its SQLite file."""
    engine = create_sqlite_engine(f"sqlite:///{home / 'shop.db'}")
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(run_table.c.id, run_table.c.status, run_table.c.workflow).where(
                    run_table.c.parent_run_id.is_(None)
                )
            )
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


def test_the_site_starts_a_run_on_commit_only_and_a_real_worker_completes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [*os.environ]:
        if name.startswith("PIKKU_DEMO_") or name == "DJANGO_SETTINGS_MODULE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIKKU_DEMO_HOME", str(tmp_path))
    env = dict(os.environ)
    log = tmp_path / "worker.log"

    def worker_log() -> str:
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""

    node = start_worker(env, log)
    try:
        node.wait_ready(timeout=60)
        site = subprocess.run(
            [sys.executable, "-m", "tests.contrib.django_site_client"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        node.kill()  # SIGKILL to the whole group: the main process and its pool

    assert site.returncode == 0, f"{site.stderr[-4000:]}\n--- worker log\n{worker_log()}"
    report = json.loads(site.stdout)
    assert "error" not in report, f"{report['error']}\n--- worker log\n{worker_log()}"
    assert report["runs_at_start"] == []

    # Rolled back: the view answered as usual, but neither the order nor a run survived.
    rolled_back = report["rolled_back"]
    assert rolled_back["status_code"] == 302
    assert rolled_back["orders_inside"] == 1
    assert rolled_back["runs_inside"] == []
    assert rolled_back["orders_after"] == 0
    assert rolled_back["runs_after"] == []

    # Committed: nothing started inside the transaction, exactly one run after it.
    committed = report["committed"]
    assert committed["status_code"] == 302
    assert committed["location"] == f"/orders/{committed['order_pk']}/"
    assert committed["runs_inside"] == []
    assert committed["runs_after"] == [committed["order_run_id"]]

    # The worker completed it, and the status page shows the outcome.
    page = report["page"]
    run_id = committed["order_run_id"]
    assert f"<code>{run_id}</code>" in page
    assert '<strong id="status">completed</strong>' in page
    assert "shipped" in page  # the output: {'outcome': 'shipped', ...}
    assert "refreshes every second" not in page  # a settled run stops refreshing
    for step in ("charge", "cooling-off", "ship"):
        assert f"<td>{step}</td>" in page
    assert report["run"]["status"] == "completed"
    assert report["run"]["output"]["outcome"] == "shipped"

    # And the store itself, read from this process: one top-level run, completed.
    assert top_level_runs(tmp_path) == [
        {"id": run_id, "status": "completed", "workflow": "shop.fulfil_order"}
    ]
