"""The run page mounted in a user's Flask app, as make_blueprint(run_page=True)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from pikku_celery import Pikku
from pikku_celery.contrib.flask import PikkuFlask, make_blueprint
from pikku_celery.web.page import ASSETS, CONTENT_SECURITY_POLICY

from . import webapp
from .support import snapshot

PREFIX = "/ops/pikku"


class Hook:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.allow = True

    def __call__(self, action: str, target: str) -> bool:
        self.calls.append((action, target))
        return self.allow


@pytest.fixture
def pikku() -> Pikku:
    return webapp.build(name="flask-mount")


@pytest.fixture
def hook() -> Hook:
    return Hook()


@pytest.fixture
def client(pikku: Pikku, hook: Hook) -> FlaskClient:
    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(make_blueprint(permission=hook, run_page=True), url_prefix=PREFIX)

    @app.get("/elsewhere")
    def elsewhere() -> str:
        return "the app's own page"

    return app.test_client()


def started(pikku: Pikku, workflow: str = webapp.WAITS, data: Any = None) -> str:
    run_id = pikku.start(workflow, data).run_id
    webapp.drive(pikku, run_id)
    return run_id


def test_the_page_is_served_with_its_mount_points_and_a_strict_csp(client: FlaskClient) -> None:
    page = client.get(f"{PREFIX}/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    text = page.get_data(as_text=True)
    assert f'data-api="{PREFIX}/api/"' in text
    assert f'src="{PREFIX}/assets/app.js"' in text
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert "http" not in text.replace("http://www.w3.org", "")  # no CDN, nothing remote
    assert client.get(PREFIX).status_code == 308  # to the page's own URL, with its slash
    for name, content_type in ASSETS.items():
        served = client.get(f"{PREFIX}/assets/{name}")
        assert served.status_code == 200, name
        assert served.content_type == content_type
        assert b"https://" not in served.data and b"cdn" not in served.data.lower()


def test_only_the_page_s_own_files_are_served(client: FlaskClient) -> None:
    for name in ("index.html", "..%2Fapi.py", "app.js.map", "x"):
        missing = client.get(f"{PREFIX}/assets/{name}")
        assert missing.status_code == 404
        assert missing.json is not None and missing.json["error"] == "not_found"


def test_the_api_answers_json_under_the_prefix_and_its_errors_are_json(
    client: FlaskClient, pikku: Pikku, hook: Hook
) -> None:
    run_id = started(pikku)
    listing = client.get(f"{PREFIX}/api/runs?status=running")
    assert listing.status_code == 200 and listing.headers["Cache-Control"] == "no-store"
    assert [r["id"] for r in listing.json["runs"]] == [run_id]
    assert listing.json["counts"]["running"] == 1
    shown = client.get(f"{PREFIX}/api/runs/{run_id}").json
    assert shown["actions"] == {"cancel": True, "retry": False, "signal": True}
    assert ("list", "runs") in hook.calls and ("status", run_id) in hook.calls
    paged = client.get(f"{PREFIX}/api/runs/{run_id}?steps_limit=1").json
    assert [s["name"] for s in paged["steps"]] == ["add"] and paged["next_steps"] == 0
    rest = client.get(f"{PREFIX}/api/runs/{run_id}?steps_after=0").json
    assert [s["name"] for s in rest["steps"]] == ["signal:approval"]
    assert rest["next_steps"] is None and rest["steps_total"] == 2
    bad = client.get(f"{PREFIX}/api/runs/{run_id}?steps_after=x")
    assert bad.status_code == 400 and bad.json["error"] == "invalid_query"

    assert client.get(f"{PREFIX}/api/runs/nope").json["error"] == "invalid_run_id"
    assert client.get(f"{PREFIX}/api/runs?limit=0").json["error"] == "invalid_query"
    unknown = client.get(f"{PREFIX}/api/nothing/here")
    assert unknown.status_code == 404 and unknown.json["error"] == "not_found"
    wrong = client.get(f"{PREFIX}/api/runs/{run_id}/cancel")
    assert wrong.status_code == 405 and wrong.json["error"] == "method_not_allowed"
    assert "POST" in wrong.headers["Allow"]
    # The app's other routes keep their own pages.
    assert client.get("/elsewhere").get_data(as_text=True) == "the app's own page"
    assert client.get("/missing").mimetype == "text/html"


def test_actions_through_the_blueprint(client: FlaskClient, pikku: Pikku, hook: Hook) -> None:
    run_id = started(pikku)
    sent = client.post(f"{PREFIX}/api/runs/{run_id}/signals/approval", json={"ok": True})
    assert sent.status_code == 202, sent.json
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).result() == {"total": 3, "approval": {"ok": True}}
    other = started(pikku)
    as_form = client.post(f"{PREFIX}/api/runs/{other}/cancel", data={"a": "1"})
    assert as_form.status_code == 415  # what a cross-site form could send
    assert client.post(f"{PREFIX}/api/runs/{other}/cancel", json={}).status_code == 202
    hook.allow = False
    refused = client.post(f"{PREFIX}/api/runs/{other}/retry", json={})
    assert refused.status_code == 403 and refused.json["error"] == "forbidden"


def test_a_body_over_the_limit_is_a_413_before_it_is_read(pikku: Pikku, hook: Hook) -> None:
    app = Flask(__name__)
    app.register_blueprint(
        make_blueprint(pikku, permission=hook, run_page=True, max_body_bytes=100)
    )
    client = app.test_client()
    run_id = started(pikku)
    before = snapshot(pikku.store)
    hook.calls.clear()
    big = client.post(
        f"/api/runs/{run_id}/signals/approval",
        data=json.dumps("x" * 200),
        content_type="application/json",
    )
    assert big.status_code == 413 and big.json["error"] == "payload_too_large"
    assert hook.calls == []  # refused before anything else
    bad = client.post(
        f"/api/runs/{run_id}/signals/approval", data="{no", content_type="application/json"
    )
    assert bad.status_code == 400 and bad.json["error"] == "invalid_json"
    assert snapshot(pikku.store) == before


def test_without_run_page_the_blueprint_is_what_it_was(pikku: Pikku, hook: Hook) -> None:
    app = Flask(__name__)
    app.register_blueprint(make_blueprint(pikku, permission=hook), url_prefix="/api")
    client = app.test_client()
    assert client.get("/api/").status_code == 404
    assert client.get("/api/api/runs").status_code == 404
    assert client.get("/api/assets/app.js").status_code == 404
