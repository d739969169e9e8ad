"""The README's main job, run as a newcomer would: a subprocess, no server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_demo_runs_every_order_to_its_designed_end(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIKKU_DEMO_")}
    env["PIKKU_DEMO_HOME"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "example_project", "--json", "--timeout", "80"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = (tmp_path / "worker.log").read_text() if (tmp_path / "worker.log").exists() else ""
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n--- worker log\n{log[-3000:]}"
    report = json.loads(done.stdout)
    outcomes = {r["order"]: r["outcome"] for r in report["runs"]}
    assert outcomes == {
        1: "shipped",
        2: "shipped",
        3: "shipped",
        4: "shipped",
        5: "refunded",
        6: "shipped",
        7: "rejected",
        8: "shipped",
    }
    assert all(r["status"] == "completed" for r in report["runs"])
    # The worker killed on purpose: its step finished on attempt 2.
    assert report["killed"]["pid"] > 0
    killed_order = next(r for r in report["runs"] if r["order"] == 3)
    assert "pack (attempt 2)" in killed_order["retried"]
    # Transient card failures were retried with backoff.
    assert "charge (attempt 2)" in next(r for r in report["runs"] if r["order"] == 2)["retried"]
    assert report["seconds"] < 60
