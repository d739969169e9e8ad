"""The run page draws a durable canvas as the tree of its nodes (real headless Chromium)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError as exc:  # locally a skip, in CI a failure (as for a missing service)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise
    pytest.skip(f"playwright is not installed: {exc}", allow_module_level=True)

from celery import chain, chord

from pikku_celery import Pikku
from pikku_celery.web.app import create_app, loopback_permission

from . import webapp
from .support import served


def test_a_canvas_run_shows_its_nodes_with_each_step_s_state(
    sqlite_pikku: Pikku, page: Any, artifacts: Path
) -> None:
    tasks = sqlite_pikku.app.tasks
    add, label, explode = tasks["web.add"], tasks["web.label"], tasks["web.explode"]
    canvas = chain(add.s(1, 2), chord([add.s(10), add.s(20)], label.s()))
    done = sqlite_pikku.durable(canvas)
    webapp.drive(sqlite_pikku, done.run_id)
    assert done.wait(timeout=5) == "parcel-[13, 23]"
    failed = sqlite_pikku.durable(chain(add.s(1, 1), explode.s(), label.s()))
    webapp.drive(sqlite_pikku, failed.run_id)
    with served(create_app(sqlite_pikku, loopback_permission(False))) as url:
        try:
            page.goto(f"{url}?run={done.run_id}")
            tree = page.locator("#canvas")
            expect(tree.locator("li")).to_have_count(6)
            expect(tree.locator('li[data-node="canvas"]')).to_contain_text("chain")
            expect(tree.locator('li[data-node="canvas.1"]')).to_contain_text("chord")
            header = tree.locator('li[data-node="canvas.1.h1"]')
            expect(header).to_contain_text("header: web.add(20)")
            expect(header).to_contain_text("succeeded")
            expect(header).to_contain_text("23")
            expect(tree.locator('li[data-node="canvas.1.body"]')).to_contain_text(
                "body: web.label()"
            )
            page.screenshot(path=str(artifacts / "run-page-canvas.png"), full_page=True)
            print(f"screenshot: {artifacts / 'run-page-canvas.png'}")

            page.goto(f"{url}?run={failed.run_id}")
            expect(page.locator('#canvas li[data-node="canvas.1"]')).to_contain_text(
                "courier exploded"
            )
            expect(page.locator('#canvas li[data-node="canvas.2"]')).to_contain_text("not started")
        finally:
            page.goto("about:blank")


def test_a_workflow_run_has_no_canvas_panel(sqlite_pikku: Pikku, page: Any) -> None:
    run_id = sqlite_pikku.start(webapp.ORDER, {"a": 2, "b": 3}).run_id
    webapp.drive(sqlite_pikku, run_id)
    with served(create_app(sqlite_pikku, loopback_permission(False))) as url:
        try:
            page.goto(f"{url}?run={run_id}")
            expect(page.locator("#run-workflow")).to_have_text(webapp.ORDER)
            expect(page.locator("#canvas")).to_have_count(0)
        finally:
            page.goto("about:blank")
