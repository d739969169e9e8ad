"""The Flask extension and the JSON blueprint, through Flask's test client."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from pikku_celery import Pikku, RunStatus
from pikku_celery.contrib.flask import PikkuFlask, current_pikku, make_blueprint

from . import support

ORDER_URL = f"/api/workflows/{support.ORDER}/runs"


class Permissions:
    """A permission hook that records its calls and refuses what it is told to."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse: set[str] = set()

    def __call__(self, action: str, target: str) -> bool:
        self.calls.append((action, target))
        return action not in self.refuse


@pytest.fixture
def pikku() -> Pikku:
    return support.make_pikku("flask-tests")


@pytest.fixture
def permissions() -> Permissions:
    return Permissions()


def make_app(pikku: Pikku, permissions: Permissions, **options: Any) -> Flask:
    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(make_blueprint(permission=permissions, **options), url_prefix="/api")
    return app


@pytest.fixture
def client(pikku: Pikku, permissions: Permissions) -> FlaskClient:
    return make_app(pikku, permissions).test_client()


def start(client: FlaskClient, body: Any = None, **kwargs: Any) -> Any:
    body = {"input": {"a": 2, "b": 3}} if body is None else body
    return client.post(ORDER_URL, json=body, **kwargs)


# --- the extension ------------------------------------------------------------


def test_the_extension_registers_itself(pikku: Pikku) -> None:
    app = Flask(__name__)
    ext = PikkuFlask()
    with pytest.raises(RuntimeError, match="needs a Pikku"):
        ext.init_app(app)
    ext.init_app(app, pikku)
    assert app.extensions["pikku_celery"] is ext
    assert ext.pikku is pikku
    with app.app_context():
        assert current_pikku() is pikku


def test_current_pikku_without_the_extension_says_what_to_do() -> None:
    with Flask(__name__).app_context(), pytest.raises(RuntimeError, match="init_app"):
        current_pikku()


def test_a_blueprint_can_be_given_its_pikku_directly(pikku: Pikku) -> None:
    app = Flask(__name__)  # no extension at all
    app.register_blueprint(make_blueprint(pikku, permission=lambda a, t: True))
    response = app.test_client().post(
        f"/workflows/{support.ORDER}/runs", json={"input": {"a": 1, "b": 1}}
    )
    assert response.status_code == 202, response.json


# --- start --------------------------------------------------------------------


def test_start_answers_202_with_the_run_and_its_location(
    client: FlaskClient, pikku: Pikku, permissions: Permissions
) -> None:
    response = start(client, {"input": {"a": 2, "b": 3}, "idempotency_key": "order-1"})
    assert response.status_code == 202, response.json
    body = response.json
    assert body["status"] == "running"
    assert body["workflow"] == support.ORDER
    assert body["input"] == {"a": 2, "b": 3}
    assert response.headers["Location"] == f"/api/runs/{body['id']}"
    assert [(s["name"], s["status"], s["task"]) for s in body["steps"]] == [
        ("add", "scheduled", "contrib.add")
    ]
    assert pikku.handle(body["id"]).status() == RunStatus.RUNNING
    assert permissions.calls == [("start", support.ORDER)]
    again = start(client, {"input": {"a": 2, "b": 3}, "idempotency_key": "order-1"})
    assert again.status_code == 202
    assert again.json["id"] == body["id"]


def test_start_without_a_body_starts_with_null_input(client: FlaskClient) -> None:
    response = client.post(f"/api/workflows/{support.FLAKY}/runs")
    assert response.status_code == 202, response.json
    assert response.json["input"] is None


@pytest.mark.parametrize(
    ("kwargs", "status", "code", "message"),
    [
        ({"data": "{not json", "content_type": "application/json"}, 400, "invalid_json", "JSON"),
        ({"data": '{"input": NaN}', "content_type": "application/json"}, 400, "invalid_payload",
         "input"),
        ({"data": "a=1", "content_type": "application/x-www-form-urlencoded"}, 415,
         "unsupported_media_type", "application/json"),
        ({"json": [1, 2]}, 400, "invalid_body", "JSON object"),
        ({"json": {"inputs": {}}}, 400, "invalid_body", "'inputs'"),
        ({"json": {"input": {}, "idempotency_key": 5}}, 400, "invalid_payload",
         "idempotency_key must be a str"),
    ],
)  # fmt: skip
def test_bad_start_requests_are_4xx_with_a_clear_message(
    client: FlaskClient, kwargs: dict[str, Any], status: int, code: str, message: str
) -> None:
    response = client.post(ORDER_URL, **kwargs)
    assert response.status_code == status
    assert response.json is not None
    assert response.json["error"] == code
    assert message in response.json["message"]


def test_an_unknown_workflow_is_404(client: FlaskClient) -> None:
    response = client.post("/api/workflows/no.such.flow/runs", json={"input": 1})
    assert response.status_code == 404
    assert response.json["error"] == "unknown_workflow"
    assert "no workflow is registered as 'no.such.flow'" in response.json["message"]


# --- status -------------------------------------------------------------------


def test_status_shows_steps_attempts_and_the_output(client: FlaskClient, pikku: Pikku) -> None:
    run_id = start(client).json["id"]
    response = client.get(f"/api/runs/{run_id}")
    assert response.status_code == 200
    assert response.json["status"] == "running"
    assert response.json["steps"][0]["attempts"] == []

    support.run_scheduled_steps(pikku, run_id)
    pikku.send_signal(run_id, "approval", True)
    pikku.orchestrate(run_id, "test")
    body = client.get(f"/api/runs/{run_id}").json
    assert body["status"] == "completed"
    assert body["terminal"] is True
    assert body["output"] == {"total": 5, "approval": True}
    assert body["error"] is None
    steps = {s["name"]: s for s in body["steps"]}
    assert steps["add"]["result"] == 5
    assert [(a["attempt"], a["status"]) for a in steps["add"]["attempts"]] == [(1, "succeeded")]
    assert steps["add"]["attempts"][0]["finished_at"].endswith("Z")
    assert [s["kind"] for s in body["steps"]] == ["task", "signal"], body["steps"]


def test_a_failed_run_shows_its_error_but_no_traceback_unless_asked(
    pikku: Pikku, permissions: Permissions
) -> None:
    client = make_app(pikku, permissions).test_client()
    run_id = client.post(f"/api/workflows/{support.FLAKY}/runs").json["id"]
    support.run_scheduled_steps(pikku, run_id)
    body = client.get(f"/api/runs/{run_id}").json
    assert body["status"] == "failed"
    assert "the courier exploded" in body["error"]["message"]
    step = body["steps"][0]
    assert step["error"] == {"type": "RuntimeError", "message": "the courier exploded"}
    assert "traceback" not in step["attempts"][0]["error"]

    verbose = make_app(pikku, permissions, tracebacks=True).test_client()
    step = verbose.get(f"/api/runs/{run_id}").json["steps"][0]
    assert "RuntimeError" in step["error"]["traceback"]


def test_status_of_an_unknown_or_malformed_run(client: FlaskClient) -> None:
    response = client.get(f"/api/runs/{uuid.uuid4()}")
    assert response.status_code == 404
    assert response.json["error"] == "unknown_run"
    response = client.get("/api/runs/not-a-uuid")
    assert response.status_code == 400
    assert response.json["error"] == "invalid_run_id"
    assert "'not-a-uuid' is not a workflow run id" in response.json["message"]


# --- signal -------------------------------------------------------------------


def test_a_signal_reaches_the_run(client: FlaskClient, pikku: Pikku) -> None:
    run_id = start(client).json["id"]
    support.run_scheduled_steps(pikku, run_id)
    response = client.post(f"/api/runs/{run_id}/signals/approval", json={"by": "alice"})
    assert response.status_code == 202, response.json
    assert response.json["id"] == run_id
    assert response.headers["Location"] == f"/api/runs/{run_id}"
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).wait(timeout=5) == {"total": 5, "approval": {"by": "alice"}}
    # A settled run takes no more signals.
    response = client.post(f"/api/runs/{run_id}/signals/approval", json=True)
    assert response.status_code == 409
    assert response.json["error"] == "run_settled"


def test_a_signal_without_a_body_carries_null(client: FlaskClient, pikku: Pikku) -> None:
    run_id = start(client).json["id"]
    support.run_scheduled_steps(pikku, run_id)
    assert client.post(f"/api/runs/{run_id}/signals/approval").status_code == 202
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).wait(timeout=5) == {"total": 5, "approval": None}


def test_bad_signal_requests(client: FlaskClient) -> None:
    run_id = start(client).json["id"]
    response = client.post(
        f"/api/runs/{run_id}/signals/approval", data="{oops", content_type="application/json"
    )
    assert (response.status_code, response.json["error"]) == (400, "invalid_json")
    response = client.post(f"/api/runs/{uuid.uuid4()}/signals/approval", json=1)
    assert (response.status_code, response.json["error"]) == (404, "unknown_run")
    response = client.post("/api/runs/123/signals/approval", json=1)
    assert (response.status_code, response.json["error"]) == (400, "invalid_run_id")


# --- cancel -------------------------------------------------------------------


def test_cancel_then_cancel_again(client: FlaskClient, pikku: Pikku) -> None:
    run_id = start(client).json["id"]
    response = client.post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 202, response.json
    assert response.json["cancel_requested"] is True
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).status() == RunStatus.CANCELLED
    response = client.post(f"/api/runs/{run_id}/cancel")
    assert response.status_code == 409
    assert "already cancelled" in response.json["message"]


def test_cancel_an_unknown_or_malformed_run(client: FlaskClient) -> None:
    assert client.post(f"/api/runs/{uuid.uuid4()}/cancel").status_code == 404
    assert client.post("/api/runs/x/cancel").status_code == 400


# --- the permission hook ------------------------------------------------------


@pytest.mark.parametrize("action", ["start", "status", "signal", "cancel"])
def test_a_refusal_is_403_and_nothing_happens(
    client: FlaskClient, pikku: Pikku, permissions: Permissions, action: str
) -> None:
    run_id = start(client).json["id"]
    permissions.refuse.add(action)
    permissions.calls.clear()
    requests = {
        "start": lambda: start(client),
        "status": lambda: client.get(f"/api/runs/{run_id}"),
        "signal": lambda: client.post(f"/api/runs/{run_id}/signals/approval", json=1),
        "cancel": lambda: client.post(f"/api/runs/{run_id}/cancel"),
    }
    before = len(pikku.store.list_runs())
    version = pikku.handle(run_id).state().version
    response = requests[action]()
    assert response.status_code == 403
    assert response.json["error"] == "forbidden"
    target = support.ORDER if action == "start" else run_id
    assert permissions.calls == [(action, target)]
    assert len(pikku.store.list_runs()) == before
    assert pikku.handle(run_id).state().version == version  # no signal, no cancel


def test_the_hook_runs_before_any_lookup(client: FlaskClient, permissions: Permissions) -> None:
    """A refused caller cannot tell an unknown run or workflow from a real one."""
    permissions.refuse.update({"start", "status"})
    assert client.post("/api/workflows/no.such.flow/runs", json={}).status_code == 403
    assert client.get(f"/api/runs/{uuid.uuid4()}").status_code == 403
    assert client.get("/api/runs/garbage").status_code == 403
    assert permissions.calls[-1] == ("status", "garbage")
