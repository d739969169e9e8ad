"""Every public call with the workflow database down.

Nothing listens on the database's port (:mod:`.down_app`): each call gives
up after the app's ``outage_timeout`` with :class:`StoreUnavailableError`
(never a driver's or SQLAlchemy's exception), the web API answers 503 with
``Retry-After``, and the CLI exits non-zero with one clear line.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

import tests.contrib.test_django  # noqa: F401 - configures Django for the session

# isort: split
from django.test import Client, override_settings

from pikku_celery import StoreUnavailableError
from pikku_celery.cli import main
from pikku_celery.contrib.django import start_on_commit
from pikku_celery.web.api import RETRY_AFTER_SECONDS
from pikku_celery.web.app import create_app

from . import down_app
from .down_app import OUTAGE_TIMEOUT, RUN_ID, pikku

GIVE_UP_WITHIN = OUTAGE_TIMEOUT + 5.0
"""The outage timeout, and room for a slow machine (one connection attempt
to a closed port is refused at once)."""

CALLS: dict[str, Callable[[], Any]] = {
    "start": lambda: pikku.start(down_app.flow, "x"),
    "start by name": lambda: pikku.start("down.flow", "x"),
    "start with an idempotency key": lambda: pikku.start(
        down_app.flow, "x", idempotency_key="order-7"
    ),
    "durable canvas": lambda: pikku.durable(down_app.echo.s("x")),
    "RunHandle.state": lambda: pikku.handle(RUN_ID).state(),
    "RunHandle.status": lambda: pikku.handle(RUN_ID).status(),
    "RunHandle.result": lambda: pikku.handle(RUN_ID).result(),
    "RunHandle.wait with a timeout": lambda: pikku.handle(RUN_ID).wait(timeout=1.0),
    "RunHandle.wait without one": lambda: pikku.handle(RUN_ID).wait(),
    "RunHandle.steps": lambda: pikku.handle(RUN_ID).steps(),
    "RunHandle.cancel": lambda: pikku.handle(RUN_ID).cancel(),
    "RunHandle.signal": lambda: pikku.handle(RUN_ID).signal("go", {"ok": True}),
    "send_signal": lambda: pikku.send_signal(RUN_ID, "go", None),
    "cancel": lambda: pikku.cancel(RUN_ID),
    "retry": lambda: pikku.retry(RUN_ID),
    "durable_run.wait": lambda: pikku.durable_run(RUN_ID).wait(timeout=1.0),
    "Django start_on_commit": lambda: start_on_commit(down_app.flow, "x"),
}


@pytest.fixture
def no_run_failed(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """No call may log that it failed a run: there is no run to fail."""
    caplog.set_level(logging.INFO, logger="pikku_celery")
    yield
    failing = [r.getMessage() for r in caplog.records if "failing the run" in r.getMessage()]
    assert failing == []


@pytest.mark.parametrize("name", list(CALLS))
def test_a_public_call_raises_store_unavailable(name: str, no_run_failed: None) -> None:
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError) as raised:
        CALLS[name]()
    took = time.monotonic() - began
    assert took < GIVE_UP_WITHIN + 2.0  # wait's LISTEN gets a moment of its own
    assert "127.0.0.1" in str(raised.value) or "unavailable" in str(raised.value)


def test_the_ride_out_lasts_the_outage_timeout(no_run_failed: None) -> None:
    """A call waits out the outage for its time before it gives up, and only that."""
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="tried for"):
        pikku.handle(RUN_ID).status()
    assert OUTAGE_TIMEOUT <= time.monotonic() - began < GIVE_UP_WITHIN


def test_wait_rides_out_within_its_own_timeout() -> None:
    """``wait(timeout)`` waits out the outage for its timeout, not the app's."""
    began = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        pikku.handle(RUN_ID).wait(timeout=OUTAGE_TIMEOUT * 4)
    assert time.monotonic() - began >= OUTAGE_TIMEOUT * 4


# --- the web API: 503 with Retry-After -----------------------------------------

RUN = f"/api/runs/{RUN_ID}"
JSON_BODY: dict[str, Any] = {"data": "{}", "content_type": "application/json"}
WEB_CALLS = [
    ("get", "/api/runs", {}),
    ("get", RUN, {}),
    ("post", f"{RUN}/cancel", JSON_BODY),
    ("post", f"{RUN}/retry", JSON_BODY),
    ("post", f"{RUN}/signals/go", JSON_BODY),
    ("get", "/metrics", {}),
    # The Flask blueprint's own endpoints.
    ("post", "/workflows/down.flow/runs", {**JSON_BODY, "data": '{"input": "x"}'}),
    ("get", f"/runs/{RUN_ID}", {}),
    ("post", f"/runs/{RUN_ID}/signals/go", JSON_BODY),
    ("post", f"/runs/{RUN_ID}/cancel", JSON_BODY),
]


def unavailable_answer(status: int, headers: Any, body: bytes) -> None:
    assert status == 503, body
    assert headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    answer = json.loads(body)
    assert answer["error"] == "store_unavailable" and "unavailable" in answer["message"]


@pytest.mark.parametrize(("method", "path", "kwargs"), WEB_CALLS)
def test_the_page_and_flask_api_answer_503(
    method: str, path: str, kwargs: dict[str, Any], no_run_failed: None
) -> None:
    client = create_app(pikku, lambda action, target: True).test_client()
    response = getattr(client, method)(path, **kwargs)
    unavailable_answer(response.status_code, response.headers, response.data)


DJANGO_CALLS = [(m, p, k) for m, p, k in WEB_CALLS if p.startswith(("/api", "/metrics"))]


@pytest.mark.parametrize(("method", "path", "kwargs"), DJANGO_CALLS)
def test_the_django_mount_answers_503(method: str, path: str, kwargs: dict[str, Any]) -> None:
    with override_settings(ROOT_URLCONF="tests.outage.django_urls"):
        response = getattr(Client(), method)(f"/down{path}", **kwargs)
    unavailable_answer(response.status_code, response, response.content)


# --- the CLI: non-zero, one clear line -----------------------------------------

CLI_CALLS = [
    ("runs", "list"),
    ("runs", "show", RUN_ID),
    ("runs", "cancel", RUN_ID),
    ("runs", "retry", RUN_ID),
    ("runs", "check-deploy"),
    ("signal", RUN_ID, "go"),
    ("sweep", "--once"),
]


@pytest.mark.parametrize("command", CLI_CALLS)
def test_the_cli_exits_non_zero_with_a_clear_line(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, ["-A", "tests.outage.down_app", *command])
    assert result.exit_code not in (0, None), result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), result.exception
    assert "Traceback" not in result.output
    assert "127.0.0.1:9" in result.output
    assert "unavailable" in result.output or "unreachable" in result.output
