"""A continue_as_new chain on the run page: its JSON and its links, from either end."""

from __future__ import annotations

import os
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError as exc:  # locally a skip, in CI a failure (as for a missing service)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise
    pytest.skip(f"playwright is not installed: {exc}", allow_module_level=True)

from pikku_celery import Context, Pikku
from pikku_celery.web.app import create_app, loopback_permission
from pikku_celery.web.permissions import read_only

from .test_api import api
from .test_browser import showing


def chain(pikku: Pikku) -> tuple[str, str]:
    """A run that continued once, and the run it continued as."""

    @pikku.workflow(name="rollover")
    def rollover(ctx: Context, n: int) -> int:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return n

    first = rollover.start(1)  # its first pass, taken here, continues
    successor = first.successor()
    assert successor is not None
    return first.run_id, successor.run_id


def test_the_api_names_both_ends_of_a_continuation(sqlite_pikku: Pikku) -> None:
    first, successor = chain(sqlite_pikku)
    before = api(sqlite_pikku, read_only).run(first).body["run"]
    after = api(sqlite_pikku, read_only).run(successor).body["run"]
    assert before["continued_as"] == successor and before["continued_from"] is None
    assert after["continued_from"] == first and after["continued_as"] is None


def test_the_page_links_a_run_to_the_run_it_continued_as_and_back(
    sqlite_pikku: Pikku, page: Any
) -> None:
    first, successor = chain(sqlite_pikku)
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(f"{url}?run={first}")
        forward = page.locator("#continued-as-link")
        expect(forward).to_have_text(successor)
        forward.click()
        expect(page.locator("#run-id")).to_have_text(successor)
        back = page.locator("#continued-from-link")
        expect(back).to_have_text(first)
        back.click()
        expect(page.locator("#run-id")).to_have_text(first)
