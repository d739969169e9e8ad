"""The run page mounted in Django with include(), through Django's test client.

Django is configured once per process by tests/contrib/test_django.py (no
pytest-django); importing it here configures it the same way whichever runs
first. Each test points ROOT_URLCONF at tests/web/django_urls.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import tests.contrib.test_django  # noqa: F401 - configures Django for the session

# isort: split
from django.test import Client, override_settings

from pikku_celery.contrib.django import get_pikku
from pikku_celery.contrib.django.views import current_request
from pikku_celery.web.page import CONTENT_SECURITY_POLICY

from . import django_urls, webapp
from .support import snapshot

ASKED: list[tuple[str, str, str]] = []


def recording_permission(action: str, target: str) -> bool:
    """A hook set by dotted path; it sees the Django request."""
    ASKED.append((action, target, current_request().path))
    return action in ("list", "status")


@pytest.fixture(autouse=True)
def urls() -> Iterator[None]:
    django_urls.ALLOWED.clear()
    django_urls.ALLOWED.update({"list", "status", "cancel", "retry", "signal"})
    ASKED.clear()
    with override_settings(ROOT_URLCONF="tests.web.django_urls"):
        yield


@pytest.fixture
def client() -> Client:
    return Client()


def started(workflow: str = webapp.WAITS, data: Any = None) -> str:
    run_id = django_urls.PIKKU.start(workflow, data).run_id
    webapp.drive(django_urls.PIKKU, run_id)
    return run_id


def test_the_page_knows_where_it_is_mounted_and_carries_a_csrf_token(client: Client) -> None:
    page = client.get("/mine/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-api="/mine/api/"' in text and 'src="/mine/assets/app.js"' in text
    assert 'data-csrf=""' not in text  # Django's token, sent back as X-CSRFToken
    assert page["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    asset = client.get("/mine/assets/timeline.js")
    assert asset.status_code == 200 and asset["Content-Type"].startswith("text/javascript")
    missing = client.get("/mine/assets/nope.js")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert client.get("/mine/api/nothing").json()["error"] == "not_found"


def test_the_same_api_answers_in_django(client: Client) -> None:
    run_id = started()
    listing = client.get("/mine/api/runs", {"workflow": webapp.WAITS})
    assert listing.status_code == 200 and listing["Cache-Control"] == "no-store"
    assert [r["id"] for r in listing.json()["runs"]] == [run_id]
    assert listing.json()["counts"]["running"] >= 1
    shown = client.get(f"/mine/api/runs/{run_id}").json()
    assert shown["run"]["workflow"] == webapp.WAITS and shown["actions"]["cancel"] is True
    paged = client.get(f"/mine/api/runs/{run_id}", {"steps_limit": "1"}).json()
    assert [s["name"] for s in paged["steps"]] == ["add"]
    assert (paged["next_steps"], paged["steps_total"]) == (0, 2)
    rest = client.get(f"/mine/api/runs/{run_id}", {"steps_after": "0"}).json()
    assert [s["name"] for s in rest["steps"]] == ["signal:approval"]
    bad = client.get(f"/mine/api/runs/{run_id}", {"steps_limit": "0"})
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_query"
    assert client.get("/mine/api/runs/44").json()["error"] == "invalid_run_id"
    unknown = client.get("/mine/api/runs/6f1c1e0e-1111-4222-8333-444455556666")
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_run"
    wrong = client.post(f"/mine/api/runs/{run_id}", content_type="application/json")
    assert wrong.status_code == 405 and wrong["Allow"] == "GET"


def test_actions_and_their_refusals(client: Client) -> None:
    pikku = django_urls.PIKKU
    run_id = started()
    before = snapshot(pikku.store)
    big = client.post(
        f"/mine/api/runs/{run_id}/signals/approval",
        data=json.dumps("x" * (pikku.max_input_bytes + 70_000)),
        content_type="application/json",
    )
    assert big.status_code == 413
    form = client.post(f"/mine/api/runs/{run_id}/cancel", {"a": "1"})
    assert form.status_code == 415
    bad = client.post(
        f"/mine/api/runs/{run_id}/cancel", data="{nope", content_type="application/json"
    )
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_json"
    django_urls.ALLOWED.discard("cancel")
    denied = client.post(
        f"/mine/api/runs/{run_id}/cancel", data={}, content_type="application/json"
    )
    assert denied.status_code == 403 and denied.json()["error"] == "forbidden"
    assert client.get(f"/mine/api/runs/{run_id}").json()["actions"]["cancel"] is False
    assert snapshot(pikku.store) == before

    sent = client.post(
        f"/mine/api/runs/{run_id}/signals/approval", data="true", content_type="application/json"
    )
    assert sent.status_code == 202, sent.json()
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).result() == {"total": 3, "approval": True}


def test_csrf_protects_the_actions_and_the_page_s_token_passes(client: Client) -> None:
    strict = Client(enforce_csrf_checks=True)
    with override_settings(MIDDLEWARE=["django.middleware.csrf.CsrfViewMiddleware"]):
        run_id = started()
        refused = strict.post(
            f"/mine/api/runs/{run_id}/cancel", data={}, content_type="application/json"
        )
        assert refused.status_code == 403  # Django's CSRF check, before the view
        page = strict.get("/mine/").content.decode()
        token = page.split('data-csrf="', 1)[1].split('"', 1)[0]
        allowed = strict.post(
            f"/mine/api/runs/{run_id}/cancel",
            data={},
            content_type="application/json",
            headers={"X-CSRFToken": token},
        )
        assert allowed.status_code == 202, allowed.content


def test_the_plain_include_uses_the_project_s_pikku_and_setting(client: Client) -> None:
    # No PIKKU_CELERY_PERMISSION and no authentication: nobody may read.
    denied = client.get("/ops/pikku/api/runs")
    assert denied.status_code == 403 and denied.json()["error"] == "forbidden"
    setting = "tests.web.test_django_mount.recording_permission"
    with override_settings(PIKKU_CELERY_PERMISSION=setting):
        project = get_pikku()
        run_id = project.start("contrib.order", {"a": 1, "b": 2}).run_id
        listing = client.get("/ops/pikku/api/runs", {"q": run_id})
        assert [r["id"] for r in listing.json()["runs"]] == [run_id]
        shown = client.get(f"/ops/pikku/api/runs/{run_id}").json()
        assert shown["actions"] == {"cancel": False, "retry": False, "signal": False}
        refused = client.post(
            f"/ops/pikku/api/runs/{run_id}/cancel", data={}, content_type="application/json"
        )
        assert refused.status_code == 403
    assert ("list", "runs", "/ops/pikku/api/runs") in ASKED
    assert ("cancel", run_id, f"/ops/pikku/api/runs/{run_id}/cancel") in ASKED


def test_metrics_are_served_in_django_behind_the_hook(client: Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    started(webapp.ORDER, {"a": 1, "b": 2})
    scraped = client.get("/mine/metrics")
    assert scraped.status_code == 200 and scraped["Content-Type"].startswith("text/plain")
    samples = {
        (sample.name, sample.labels.get("status", "")): sample.value
        for family in text_string_to_metric_families(scraped.content.decode())
        for sample in family.samples
    }
    for status, n in django_urls.PIKKU.store.count_runs_by_status().items():
        assert samples[("pikku_runs", status.value)] == n
    assert client.post("/mine/metrics").status_code == 405
    django_urls.ALLOWED.discard("list")
    refused = client.get("/mine/metrics")
    assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
    # The plain include asks the project's hook, with the request at hand.
    with override_settings(
        PIKKU_CELERY_PERMISSION="tests.web.test_django_mount.recording_permission"
    ):
        assert client.get("/ops/pikku/metrics").status_code == 200
    assert ("list", "runs", "/ops/pikku/metrics") in ASKED


def test_actions_are_kept_with_the_signed_in_user_and_the_client_address(client: Client) -> None:
    from types import SimpleNamespace

    from django.test import RequestFactory

    from pikku_celery.contrib.django.views import request_user

    run_id = started()
    sent = client.post(
        f"/mine/api/runs/{run_id}/signals/approval",
        data="true",
        content_type="application/json",
        REMOTE_ADDR="198.51.100.4",
    )
    assert sent.status_code == 202
    [entry] = django_urls.PIKKU.store.audit_trail(run_id)
    assert (entry.actor, entry.origin) == ("api", "198.51.100.4")  # nobody signed in
    request = RequestFactory().post("/", REMOTE_ADDR="203.0.113.5")
    request.user = SimpleNamespace(is_authenticated=True, get_username=lambda: "dora")
    who = request_user(request)
    assert (who.actor, who.origin) == ("dora", "203.0.113.5")
    shown = client.get(f"/mine/api/runs/{run_id}").json()
    assert [(e["action"], e["actor"]) for e in shown["audit"]] == [("signal", "api")]
