"""Fixtures of the run page's tests: a Pikku on SQLite, and headless Chromium.

Chromium is Debian's (``.ci/run`` installs it), driven by Playwright for
Python; no browser is ever downloaded. Without it the browser tests skip
locally and fail in CI (``tests.services.unavailable``).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pikku_celery import Pikku
from tests.services import unavailable

from . import webapp

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def sqlite_pikku(tmp_path: Path) -> Iterator[Pikku]:
    """The test Pikku on an SQLite file of its own."""
    pikku = webapp.build(f"sqlite:///{tmp_path / 'web.db'}")
    yield pikku
    assert pikku.sql_engine is not None
    pikku.sql_engine.dispose()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A persistent headless Chromium context with a fresh profile, per module:
    Playwright's sync API keeps an event loop running in the main thread
    while it is up, and Django refuses its ORM to code under a running loop
    (SynchronousOnlyOperation), so no later module's test may run beside it."""
    executable = shutil.which("chromium")
    if executable is None:
        unavailable("chromium", FileNotFoundError("no chromium on PATH (see .ci/run)"))
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        unavailable("playwright", exc)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=executable,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh tab; a JavaScript error on it fails the test."""
    tab = browser.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda exc: errors.append(str(exc)))
    tab.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    yield tab
    tab.close()
    assert errors == [], errors


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: ``PIKKU_ARTIFACTS``, else the session's tmp dir."""
    chosen = os.environ.get("PIKKU_ARTIFACTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path
