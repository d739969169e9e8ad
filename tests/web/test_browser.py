"""The run page in real headless Chromium (Debian's), driven by Playwright.

The app is the standalone one (``pikku_celery.web.app``) on waitress, on a
free loopback port, over a Pikku on SQLite whose steps the tests run by hand
(:mod:`tests.web.webapp`). The superseded attempt is real: a worker process
claims the step, is SIGKILLed mid-body, its lease lapses on the store's
clock, and this process takes the step over as attempt 2.

Screenshots of the list and of a run go to ``PIKKU_ARTIFACTS`` (default: the
session's tmp dir); their paths are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError as exc:  # locally a skip, in CI a failure (as for a missing service)
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise
    pytest.skip(f"playwright is not installed: {exc}", allow_module_level=True)

from pikku_celery import Pikku, RunStatus
from pikku_celery.store import AttemptStatus, Delivery, StepKind, StepStatus
from pikku_celery.web.app import create_app, loopback_permission
from pikku_celery.web.permissions import read_only
from pikku_celery.web.reads import STEPS_LIMIT
from pikku_celery.web.serve import WsgiApp
from tests.helpers import wait_until

from . import webapp
from .support import served, snapshot

ROOT = Path(__file__).resolve().parents[2]
RUN_POLL_MS = 1000  # app.js's polling period of a live run

COUNT_FETCHES = """
window.__fetches = [];
const realFetch = window.fetch;
window.fetch = (...args) => { window.__fetches.push(String(args[0])); return realFetch(...args); };
"""


@contextmanager
def showing(page: Any, app: WsgiApp) -> Iterator[str]:
    """``app`` served for ``page``; the page leaves before the server stops (no
    poll of it may outlive the server)."""
    with served(app) as url:
        try:
            yield url
        finally:
            page.goto("about:blank")


def start(pikku: Pikku, workflow: str, data: Any = None, **options: Any) -> str:
    run_id = pikku.start(workflow, data, **options).run_id
    webapp.drive(pikku, run_id)
    return run_id


def shot(page: Any, artifacts: Path, name: str) -> Path:
    path = artifacts / name
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def test_the_list_shows_finished_failed_and_running_runs_with_counts(
    sqlite_pikku: Pikku, page: Any, artifacts: Path
) -> None:
    done = start(sqlite_pikku, webapp.ORDER, {"a": 2, "b": 3}, idempotency_key="order-1")
    failed = start(sqlite_pikku, webapp.FAILS, {"id": 9})
    running = start(sqlite_pikku, webapp.WAITS, None)
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(url)
        rows = page.locator("#runs tbody tr")
        expect(rows).to_have_count(3)
        for run_id, status in ((done, "completed"), (failed, "failed"), (running, "running")):
            expect(page.locator(f'tr[data-run-id="{run_id}"]')).to_have_attribute(
                "data-status", status
            )
        counts = {"all": 3, "running": 1, "completed": 1, "failed": 1, "cancelled": 0}
        for status, n in counts.items():
            expect(page.locator(f'#counts [data-status="{status}"] .n')).to_have_text(str(n))
        expect(page.locator(f'tr[data-run-id="{failed}"]')).to_contain_text("courier exploded")
        version = sqlite_pikku.registry.get(webapp.WAITS).version  # each run's, as it started
        expect(page.locator(f'tr[data-run-id="{running}"] td.version')).to_have_text(version)
        shot(page, artifacts, "run-page-list.png")

        page.click('#counts [data-status="failed"]')  # a count is a filter
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-run-id", failed)
        assert "status=failed" in page.url
        expect(page.locator('#counts [data-status="all"] .n')).to_have_text("3")

        page.click("a.clear")
        page.fill("#filter-q", "order-1")  # an idempotency key
        page.click('#filters button[type="submit"]')
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-run-id", done)
        page.go_back()  # the filters live in the URL: back is the previous list
        expect(rows).to_have_count(3)

        page.click(f'tr[data-run-id="{running}"] a')
        expect(page.locator("#run-workflow")).to_have_text(webapp.WAITS)
        expect(page.locator("#run-version")).to_have_text(version)
        retention = "runs are kept for good (no retention set)"  # Pikku(retention=...)
        expect(page.locator("#run-retention")).to_have_text(retention)
        assert page.url.endswith(f"?run={running}")


def test_a_step_taken_over_from_a_sigkilled_worker_shows_both_attempts(
    sqlite_pikku: Pikku, page: Any, artifacts: Path, tmp_path: Path
) -> None:
    store = sqlite_pikku.store
    run_id = start(sqlite_pikku, webapp.PACKS, 7)
    [timer] = [s for s in store.get_steps(run_id) if s.kind == StepKind.SLEEP]
    assert timer.wake_at is not None
    wait_until(lambda: store.now_ms() >= (timer.wake_at or 0))
    sqlite_pikku.orchestrate(run_id, "test")  # what the timer's wake-up message does
    [pack] = webapp.due_steps(sqlite_pikku, run_id)
    assert pack.name == "pack"

    mark = tmp_path / "worker.pid"
    log = (tmp_path / "worker.log").open("wb")
    url = str(sqlite_pikku.sql_engine.url) if sqlite_pikku.sql_engine is not None else ""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.web.killed_worker", url, pack.id, str(mark)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until(lambda: mark.exists() and mark.read_text(), timeout=30)  # in the body
        claimed = store.get_step(pack.id)
        assert claimed is not None and claimed.status == StepStatus.RUNNING
        assert claimed.attempt == 1 and claimed.worker != sqlite_pikku.worker_id

        def renewed() -> bool:  # its worker renews the lease while the body runs
            return any(a.renewals for a in store.get_attempts(run_id) if a.step_id == pack.id)

        wait_until(renewed, timeout=10)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        log.close()

    def lapsed() -> bool:
        step = store.get_step(pack.id)
        return step is not None and store.now_ms() > (step.lease_expires_at or 0)

    wait_until(lapsed, timeout=10)  # nobody renews it now: judged on the store's clock
    taken = store.get_step(pack.id)
    assert taken is not None
    webapp.run_step(sqlite_pikku, taken)  # the next claim takes over as attempt 2
    assert sqlite_pikku.handle(run_id).result() == {"total": 8, "box": "box-7"}
    first, second = sorted(
        (a for a in store.get_attempts(run_id) if a.step_id == pack.id), key=lambda a: a.attempt
    )
    assert (first.status, second.status) == (AttemptStatus.SUPERSEDED, AttemptStatus.SUCCEEDED)
    assert first.worker == claimed.worker and first.worker is not None
    assert first.renewals >= 1 and first.renewed_at is not None  # until it was killed

    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(f"{url}?run={run_id}")
        expect(page.locator("#run-status")).to_have_text("completed")
        attempts = page.locator('#timeline-svg g.attempt[data-step="pack"]')
        expect(attempts).to_have_count(2)
        one, two = attempts.nth(0), attempts.nth(1)
        expect(one).to_have_attribute("data-attempt", "1")
        expect(one).to_have_attribute("data-status", "superseded")
        expect(one).to_have_class(re.compile(r"\bstatus-superseded\b"))
        expect(one).to_have_attribute("data-renewals", str(first.renewals))
        expect(one.locator("line.renewal")).to_have_count(1)  # its worker last heard of
        expect(two).to_have_attribute("data-status", "succeeded")
        expect(page.locator('#timeline-svg g.wait-step[data-kind="sleep"]')).to_have_count(1)
        expect(page.locator('#steps tr[data-step="cool-off"]')).to_contain_text("woke")

        two.click()
        detail = page.locator("#attempt-detail")
        expect(detail).to_have_attribute("data-attempt", "2")
        expect(page.locator("#attempt-result")).to_contain_text('"box-7"')
        one.click()
        expect(detail).to_have_attribute("data-attempt", "1")
        expect(detail).to_contain_text("attempt 1 of 2")
        expect(detail).to_contain_text("superseded")
        expect(detail).to_contain_text(first.worker)
        expect(detail).to_contain_text(f"lease renewals{first.renewals}, the last at")
        shot(page, artifacts, "run-page-run.png")


def test_a_running_run_turns_completed_without_a_reload_and_polling_stops(
    sqlite_pikku: Pikku, page: Any
) -> None:
    run_id = start(sqlite_pikku, webapp.WAITS, None)
    page.clock.install()  # the page's timers run when the test says: no waiting on them
    page.add_init_script(COUNT_FETCHES)
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(f"{url}?run={run_id}")
        status = page.locator("#run-status")
        expect(status).to_have_text("running")
        expect(page.locator("#live")).to_contain_text("live")
        page.evaluate("window.__notReloaded = true")
        page.clock.run_for(RUN_POLL_MS)  # a poll while nothing changed
        expect(status).to_have_text("running")

        sqlite_pikku.send_signal(run_id, "approval", "ok")
        sqlite_pikku.orchestrate(run_id, "test")  # what the signal's wake-up does
        page.clock.run_for(RUN_POLL_MS)
        expect(status).to_have_text("completed")
        expect(page.locator("#run-output")).to_contain_text('"approval": "ok"')
        expect(page.locator("#live")).to_have_text("completed: not updating")
        assert page.evaluate("window.__notReloaded") is True

        polls = page.evaluate("window.__fetches.length")
        page.clock.run_for(20 * RUN_POLL_MS)
        assert page.evaluate("window.__fetches.length") == polls  # settled: no more polls


def test_a_long_history_shows_a_page_of_steps_and_more_on_asking_while_polling(
    sqlite_pikku: Pikku, page: Any
) -> None:
    extra = 7
    run_id = start(sqlite_pikku, webapp.LONG, STEPS_LIMIT + extra)  # its steps, then a signal's
    page.clock.install()  # the page's polls run when the test says
    page.add_init_script(COUNT_FETCHES)
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(f"{url}?run={run_id}")
        rows = page.locator("#steps tbody tr")
        expect(rows).to_have_count(STEPS_LIMIT)
        more = page.locator("#more-steps")
        expect(more).to_have_text(f"Show more steps ({extra + 1} more)")

        more.click()
        expect(rows).to_have_count(STEPS_LIMIT + extra + 1)
        expect(more).to_have_count(0)
        expect(rows.last).to_have_attribute("data-step", "signal:go")
        asked = page.evaluate("window.__fetches")
        assert any(f"steps_after={STEPS_LIMIT - 1}" in a for a in asked), asked

        sqlite_pikku.send_signal(run_id, "go", None)
        sqlite_pikku.orchestrate(run_id, "test")  # what the signal's wake-up does
        page.clock.run_for(RUN_POLL_MS)  # the poll reads both pages again
        expect(page.locator("#run-status")).to_have_text("completed")
        expect(rows).to_have_count(STEPS_LIMIT + extra + 2)  # the step after the signal
        expect(more).to_have_count(0)


def test_the_progress_panel_shows_each_keys_latest_value_and_every_event_in_order(
    sqlite_pikku: Pikku, page: Any
) -> None:
    run_id = start(sqlite_pikku, webapp.PROGRESS, 2)
    page.clock.install()  # the page's polls run when the test says
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(f"{url}?run={run_id}")
        panel = page.locator("#events")
        expect(panel.locator("h2")).to_have_text("Progress")
        stage = panel.locator('.events-latest [data-event="stage"] .event-value')
        expect(stage).to_have_text('"waiting for the courier"')
        expect(panel.locator('.events-latest [data-event="packed"] .event-value')).to_have_text("2")
        expect(panel.locator("#all-events summary")).to_have_text("all 4 event(s), in order")

        panel.locator("#all-events summary").click()  # open: it stays open across polls
        sqlite_pikku.send_signal(run_id, "courier", "ok")
        sqlite_pikku.orchestrate(run_id, "test")  # what the signal's wake-up does
        page.clock.run_for(RUN_POLL_MS)
        expect(page.locator("#run-status")).to_have_text("completed")
        expect(stage).to_have_text('"shipped"')
        expect(page.locator("#all-events")).to_have_attribute("open", "")
        rows = page.locator("#all-events tbody tr")
        expect(rows).to_have_count(5)
        cells = [rows.nth(i).locator("td") for i in range(5)]
        seen = [(row.nth(1).inner_text(), row.nth(3).inner_text()) for row in cells]
        assert seen == [
            ("stage", '"packing"'),
            ("packed", "1"),
            ("packed", "2"),
            ("stage", '"waiting for the courier"'),
            ("stage", '"shipped"'),
        ]


def test_cancel_from_the_page_asks_first_then_cancels_the_run(
    sqlite_pikku: Pikku, page: Any
) -> None:
    run_id = start(sqlite_pikku, webapp.WAITS, None)
    store = sqlite_pikku.store
    with showing(page, create_app(sqlite_pikku, loopback_permission(True))) as url:
        page.goto(f"{url}?run={run_id}")
        dialog = page.locator("#confirm")
        page.click("#action-cancel")
        expect(dialog).to_be_visible()
        expect(page.locator("#confirm-title")).to_have_text("Cancel this run?")
        page.click("#confirm-no")  # changed my mind
        expect(dialog).to_be_hidden()
        run = store.get_run(run_id)
        assert run is not None and not run.cancel_requested

        page.click("#action-cancel")
        page.click("#confirm-yes")
        expect(dialog).to_be_hidden()
        expect(page.locator("#notice")).to_contain_text("Cancel requested")
        expect(page.locator("#cancelling")).to_be_visible()
        run = store.get_run(run_id)
        assert run is not None and run.cancel_requested
        expect(page.locator("#action-cancel")).to_have_count(0)  # asked already

        sqlite_pikku.orchestrate(run_id, "test")  # the pass the cancel's wake-up starts
        expect(page.locator("#run-status")).to_have_text("cancelled")  # seen by polling
        assert sqlite_pikku.handle(run_id).status() == RunStatus.CANCELLED


def test_a_signal_sent_from_the_page_completes_the_run(sqlite_pikku: Pikku, page: Any) -> None:
    run_id = start(sqlite_pikku, webapp.WAITS, None)
    with showing(page, create_app(sqlite_pikku, loopback_permission(True))) as url:
        page.goto(f"{url}?run={run_id}")
        page.click("#action-signal")
        page.fill("#signal-name", "approval")
        page.fill("#signal-payload", "{not json")
        page.click("#confirm-yes")
        expect(page.locator("#confirm-error")).to_contain_text("not JSON")  # nothing sent
        assert sqlite_pikku.store.get_signals(run_id) == {}
        page.fill("#signal-payload", '{"by": "ann"}')
        page.click("#confirm-yes")
        expect(page.locator("#notice")).to_contain_text("Signal sent")
        assert sqlite_pikku.store.get_signals(run_id) == {"approval": {"by": "ann"}}
        sqlite_pikku.orchestrate(run_id, "test")
        expect(page.locator("#run-status")).to_have_text("completed")
        expect(page.locator('#signals [data-signal="approval"]')).to_contain_text("taken")


def test_with_a_denying_hook_the_buttons_are_absent_and_the_api_says_403(
    sqlite_pikku: Pikku, page: Any
) -> None:
    run_id = start(sqlite_pikku, webapp.WAITS, None)
    failed = start(sqlite_pikku, webapp.FAILS, 1)
    before = snapshot(sqlite_pikku.store)
    with showing(page, create_app(sqlite_pikku, read_only)) as url:
        for shown in (run_id, failed):
            page.goto(f"{url}?run={shown}")
            expect(page.locator("#timeline-svg")).to_be_visible()
            expect(page.locator("#actions button")).to_have_count(0)
        for path in (f"api/runs/{run_id}/cancel", f"api/runs/{failed}/retry"):
            answer = page.request.post(
                url + path, data="{}", headers={"Content-Type": "application/json"}
            )
            assert answer.status == 403
            assert json.loads(answer.text())["error"] == "forbidden"
        answer = page.request.post(
            f"{url}api/runs/{run_id}/signals/approval",
            data='"yes"',
            headers={"Content-Type": "application/json"},
        )
        assert answer.status == 403
    assert snapshot(sqlite_pikku.store) == before


NOTE = "gift wrap, " * 40  # an argument longer than the page shows at first
FIRST_TASK = "2f0c9d3e-5b8a-4c1e-9f3a-000000000001"  # what Celery's messages would carry
SECOND_TASK = "2f0c9d3e-5b8a-4c1e-9f3a-000000000002"


def page_clock(ms: int) -> str:
    """A store time as the page writes it (format.js ``clock``)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def test_a_retried_run_shows_its_earlier_failure_who_retried_it_and_where_it_ran(
    sqlite_pikku: Pikku, page: Any, artifacts: Path
) -> None:
    order = {"id": 42, "cents": 1999, "note": NOTE}
    run_id = sqlite_pikku.start(webapp.CHARGES, order).run_id
    webapp.DECLINING.set()
    try:
        webapp.drive(sqlite_pikku, run_id, delivery=Delivery(FIRST_TASK, "celery@shop-a"))
    finally:
        webapp.DECLINING.clear()
    assert sqlite_pikku.handle(run_id).status() == RunStatus.FAILED
    with showing(page, create_app(sqlite_pikku, loopback_permission(True))) as url:
        page.goto(f"{url}?run={run_id}")
        expect(page.locator("#run-error")).to_contain_text("card declined for order 42")
        page.click("#action-retry")
        page.click("#confirm-yes")
        expect(page.locator("#notice")).to_contain_text("Retrying")
        entry = page.locator('#audit tr[data-action="retry"]')
        expect(entry).to_have_count(1)
        expect(entry.locator(".actor")).to_have_text("api")  # the standalone page names nobody
        expect(entry.locator(".origin")).to_have_text("127.0.0.1")
        expect(entry).to_contain_text("card declined for order 42")  # the failure it cleared
        [audited] = sqlite_pikku.store.audit_trail(run_id)
        expect(entry.locator("td").first).to_have_text(page_clock(audited.at))  # when
        expect(page.locator('#timeline-svg .action-mark[data-action="retry"]')).to_have_count(1)

        [failed] = sqlite_pikku.store.get_steps(run_id)
        webapp.run_step(sqlite_pikku, failed, Delivery(SECOND_TASK, "celery@shop-b"))
        expect(page.locator("#run-status")).to_have_text("completed")  # seen by polling

        page.click('#steps tr[data-step="charge"]')  # its last attempt
        detail = page.locator("#attempt-detail")
        expect(detail).to_have_attribute("data-attempt", "2")
        expect(page.locator("#attempt-node")).to_have_text("celery@shop-b")
        expect(page.locator("#attempt-task-id")).to_have_text(SECOND_TASK)
        args = page.locator("#attempt-args")
        expect(args).to_have_text("[42,1999]")
        kwargs = page.locator("#attempt-kwargs")
        expect(kwargs.locator("summary")).to_contain_text("show all")
        expect(kwargs.locator("pre")).to_be_hidden()
        kwargs.locator("summary").click()  # the whole value, on demand
        expect(kwargs.locator("pre")).to_be_visible()
        expect(kwargs.locator("pre")).to_contain_text(NOTE.strip())

        page.click('#timeline-svg [data-step="charge"][data-attempt="1"]')  # the earlier failure
        expect(detail).to_have_attribute("data-attempt", "1")
        expect(detail).to_contain_text("card declined for order 42")
        expect(page.locator("#attempt-node")).to_have_text("celery@shop-a")
        expect(page.locator("#attempt-task-id")).to_have_text(FIRST_TASK)
        shot(page, artifacts, "run-page-retried.png")


def test_the_list_shows_runs_waiting_for_a_signal_or_sleeping(
    sqlite_pikku: Pikku, page: Any, artifacts: Path
) -> None:
    waits = sqlite_pikku.start(webapp.WAITS, None).run_id
    sleeps = sqlite_pikku.start(webapp.PACKS, 3).run_id
    for run_id in (waits, sleeps):
        webapp.run_step(sqlite_pikku, webapp.due_steps(sqlite_pikku, run_id)[0])
    with showing(page, create_app(sqlite_pikku, loopback_permission(False))) as url:
        page.goto(url)
        expect(page.locator("#runs tbody tr")).to_have_count(2)
        signal_wait = page.locator(f'tr[data-run-id="{waits}"] [data-waiting]')
        expect(signal_wait).to_have_attribute("data-waiting", "signal")
        expect(signal_wait).to_contain_text("waiting for signal approval")
        sleep = page.locator(f'tr[data-run-id="{sleeps}"] [data-waiting]')
        expect(sleep).to_have_attribute("data-waiting", "sleep")
        expect(sleep).to_contain_text(re.compile(r"sleeping until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d"))
        shot(page, artifacts, "run-page-list-waiting.png")
