"""``POST api/runs/bulk/<cancel|retry>``: a filter's runs acted on behind the
permission hook, each audited; a dry run and every refusal change nothing.
Framework-neutral on the memory store, then through Flask and Django."""

from __future__ import annotations

import json
from typing import Any

import pytest

import tests.contrib.test_django  # noqa: F401 - configures Django for the session

# isort: split
from django.test import Client, override_settings
from flask import Flask

from pikku_celery import RunStatus
from pikku_celery.contrib.flask import PikkuFlask, make_blueprint
from pikku_celery.model.values import Operator

from . import django_bulk_urls, webapp
from .support import snapshot
from .test_api import Hook, Shop, api, error, json_body, shop

__all__ = ["shop"]

OPS = Operator("ops", "10.0.0.7")


def failed_payments(shop: Shop, n: int) -> list[str]:
    ids = [shop.start("payment", {"id": i}) for i in range(n)]
    shop.run()
    assert all(shop.engine.store.get_run(r).status == RunStatus.FAILED for r in ids)  # type: ignore[union-attr]
    return ids


def test_retry_by_filter_acts_on_each_run_and_audits_it(shop: Shop) -> None:
    failed = failed_payments(shop, 3)
    waiting = shop.start("approval")
    hook = Hook()
    answer = api(shop.engine, hook).bulk("retry", json_body({"workflow": "payment"}), OPS)
    assert answer.status == 202, answer.body
    assert answer.body["action"] == "retry" and answer.body["picked"] == 3
    assert sorted(answer.body["done"]) == sorted(failed) and answer.body["more"] is False
    assert hook.calls[0] == ("retry", "runs")  # the bulk action, then each run
    assert sorted(t for a, t in hook.calls[1:]) == sorted(failed)
    for run_id in failed:
        [entry] = shop.engine.store.audit_trail(run_id)
        assert (entry.action, entry.actor, entry.origin) == ("retry", "ops", "10.0.0.7")
    assert shop.engine.store.audit_trail(waiting) == []
    cancel = api(shop.engine).bulk("cancel", json_body({"status": "running"}))
    assert waiting in cancel.body["done"]


def test_a_dry_run_and_refusals_change_nothing(shop: Shop) -> None:
    failed = failed_payments(shop, 3)
    before = snapshot(shop.engine.store)
    dry = api(shop.engine).bulk("retry", json_body({"since": "1h", "dry_run": True}))
    assert dry.status == 200 and sorted(dry.body["done"]) == sorted(failed)
    denied = api(shop.engine, Hook("retry")).bulk("retry", json_body({"workflow": "payment"}))
    assert "not allowed to retry 'runs'" in error(denied, 403, "forbidden")
    bad = api(shop.engine)
    assert "unknown key(s) 'workflw'" in error(
        bad.bulk("retry", json_body({"workflw": "payment"})), 400, "invalid_body"
    )
    assert "needs a filter" in error(bad.bulk("retry", json_body({})), 400, "invalid_body")
    assert "acts on runs that are failed" in error(
        bad.bulk("retry", json_body({"status": "completed"})), 400, "invalid_body"
    )
    error(bad.bulk("purge", json_body({"status": "failed"})), 404, "not_found")
    form = json_body(raw=b"status=failed", mimetype="application/x-www-form-urlencoded")
    error(bad.bulk("retry", form), 415, "unsupported_media_type")
    assert snapshot(shop.engine.store) == before


def test_the_hook_may_refuse_single_runs_and_limit_leaves_more(shop: Shop) -> None:
    failed = failed_payments(shop, 3)
    spared = failed[0]

    def hook(action: str, target: str) -> bool:
        return target != spared

    answer = api(shop.engine, hook).bulk("retry", json_body({"status": "failed", "limit": 2}))
    assert answer.body["more"] is True and answer.body["picked"] == 2
    newest_two = failed[:0:-1]
    assert answer.body["done"] == [r for r in newest_two if r != spared]
    rest = api(shop.engine, hook).bulk("retry", json_body({"status": "failed"})).body
    assert rest["done"] == [] and list(rest["refused"]) == [spared]
    assert shop.engine.store.get_run(spared).status == RunStatus.FAILED  # type: ignore[union-attr]


def test_bulk_through_the_flask_blueprint() -> None:
    pikku = webapp.build(name="flask-bulk")
    runs = [pikku.start(webapp.WAITS).run_id for _ in range(2)]
    allowed = {"cancel"}
    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(
        make_blueprint(permission=lambda a, t: a in allowed, run_page=True), url_prefix="/ops"
    )
    client = app.test_client()
    done = client.post("/ops/api/runs/bulk/cancel", json={"workflow": webapp.WAITS})
    assert done.status_code == 202, done.json
    assert sorted(done.json["done"]) == sorted(runs)
    refused = client.post("/ops/api/runs/bulk/retry", json={"workflow": webapp.WAITS})
    assert refused.status_code == 403 and refused.json["error"] == "forbidden"


@pytest.fixture
def django_client() -> Any:
    django_bulk_urls.ALLOWED.clear()
    django_bulk_urls.ALLOWED.update({"list", "status", "retry"})
    with override_settings(ROOT_URLCONF="tests.web.django_bulk_urls"):
        yield Client()


def test_bulk_through_django(django_client: Any) -> None:
    pikku = django_bulk_urls.PIKKU
    run_id = pikku.start(webapp.WAITS).run_id
    body = json.dumps({"workflow": webapp.WAITS, "status": "running"})
    url = "/bulk/api/runs/bulk/cancel"
    denied = django_client.post(url, data=body, content_type="application/json")
    assert denied.status_code == 403 and denied.json()["error"] == "forbidden"
    assert pikku.store.audit_trail(run_id) == []
    django_bulk_urls.ALLOWED.add("cancel")
    done = django_client.post(url, data=body, content_type="application/json")
    assert done.status_code == 202 and done.json()["done"] == [run_id]
    [entry] = pikku.store.audit_trail(run_id)
    assert entry.action == "cancel"
