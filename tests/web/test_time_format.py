"""One run reads the same through every mount: the Flask blueprint's own API,
the run page's API mounted in Flask, and the run page mounted in Django all
spell its times as ISO 8601 UTC with ``Z``, to the millisecond."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import tests.contrib.test_django  # noqa: F401 - configures Django for the session

# isort: split
from django.test import Client, override_settings
from flask import Flask

from pikku_celery.contrib.flask import make_blueprint
from pikku_celery.store import Delivery

from . import django_urls, webapp

ISO_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def django_client() -> Iterator[Client]:
    with override_settings(ROOT_URLCONF="tests.web.django_urls"):
        yield Client()


def test_the_flask_api_the_page_api_and_django_spell_one_run_alike(
    django_client: Client,
) -> None:
    pikku = django_urls.PIKKU  # one store behind all three
    run_id = pikku.start(webapp.FAILS, {"order": 1}).run_id
    webapp.drive(pikku, run_id, delivery=Delivery("task-t", "celery@t"))
    app = Flask(__name__)
    allow = lambda action, target: True  # noqa: E731
    app.register_blueprint(make_blueprint(pikku, permission=allow, run_page=True), url_prefix="/f")
    flask = app.test_client()

    own = flask.get(f"/f/runs/{run_id}").get_json()  # the blueprint's own API
    page = flask.get(f"/f/api/runs/{run_id}").get_json()  # the run page's, in Flask
    dj = django_client.get(f"/mine/api/runs/{run_id}").json()  # the run page's, in Django

    assert page == {**dj, "now": page["now"]}  # the same answer, but for the moment asked
    for key in ("created_at", "updated_at"):
        assert own[key] == page["run"][key] == dj["run"][key]
        assert ISO_Z.match(own[key]), own[key]
    [own_attempt] = own["steps"][0]["attempts"]
    [page_attempt] = page["steps"][0]["attempts"]
    for key in ("started_at", "finished_at"):
        assert own_attempt[key] == page_attempt[key] and ISO_Z.match(own_attempt[key])
    assert (own_attempt["task_id"], own_attempt["node"]) == ("task-t", "celery@t")
    assert own["steps"][0]["args"] == page["steps"][0]["args"] == [{"order": 1}]
    assert all(ISO_Z.match(t) for t in _times(own) + _times(page) + _times(dj))


def _times(value: Any, key: str = "") -> list[str]:
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in _times(v, k)]
    if isinstance(value, list):
        return [t for v in value for t in _times(v, key)]
    if isinstance(value, str) and (key.endswith("_at") or key in ("now", "at", "until")):
        return [value]
    return []
