"""The README's main job, run as a newcomer would: a subprocess, no server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_the_demo_runs_every_order_to_its_designed_end_and_serves_its_run_page(
    tmp_path: Path,
) -> None:
    """One demo run (it costs seconds): its report, then its page and metrics."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIKKU_DEMO_")}
    env["PIKKU_DEMO_HOME"] = str(tmp_path)
    demo = subprocess.Popen(
        [sys.executable, "-m", "example_project", "--json", "--web", "--web-port", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        address = None
        assert demo.stderr is not None
        progress = []
        for line in demo.stderr:  # the demo's progress, then the page's address
            progress.append(line)
            if line.startswith("run page: "):
                address = line.split()[2]
                break
        log = (tmp_path / "worker.log").read_text() if (tmp_path / "worker.log").exists() else ""
        assert address is not None, (
            f"no run page address: {''.join(progress)[-3000:]}\n{log[-3000:]}"
        )
        base, _, run_id = address.partition("?run=")
        with urllib.request.urlopen(f"{base}api/runs/{run_id}", timeout=10) as answer:
            shown = json.load(answer)
        attempts = {s["name"]: [a["status"] for a in s["attempts"]] for s in shown["steps"]}
        assert attempts["pack"] == ["superseded", "succeeded"]  # the worker killed mid-step
        with urllib.request.urlopen(f"{base}metrics", timeout=10) as answer:
            scraped = answer.read().decode()
        runs = {
            sample.labels["status"]: sample.value
            for family in text_string_to_metric_families(scraped)
            if family.name == "pikku_runs"
            for sample in family.samples
        }
        # Eight orders and their shipping children, all settled.
        assert runs["running"] == 0 and runs["completed"] >= 8
    finally:
        demo.send_signal(signal.SIGINT)
        out, _ = demo.communicate(timeout=30)
    assert demo.returncode == 0
    report = json.loads(out)
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
