"""The Flask extension and the JSON blueprint, through Flask's test client."""

from __future__ import annotations

import io
import uuid
from typing import Any

import pytest
from flask import Blueprint, Flask, request
from flask.testing import FlaskClient

from pikku_celery import Context, Pikku, RunStatus
from pikku_celery.contrib.flask import ENVELOPE_BYTES, PikkuFlask, current_pikku, make_blueprint

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


def test_start_with_a_timeout_gives_the_run_its_deadline(client: FlaskClient, pikku: Pikku) -> None:
    response = start(client, {"input": {"a": 2, "b": 3}, "timeout": 600})
    assert response.status_code == 202, response.json
    state = pikku.handle(response.json["id"]).state()
    assert state.deadline_at == state.created_at + 600_000


def test_an_explicit_null_input_starts_with_null_input(client: FlaskClient) -> None:
    response = client.post(f"/api/workflows/{support.FLAKY}/runs", json={"input": None})
    assert response.status_code == 202, response.json
    assert response.json["input"] is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "no body"),
        ({"data": "  ", "content_type": "application/json"}, "no body"),
        ({"json": {}}, "lacks the key 'input'"),
        ({"json": {"idempotency_key": "order-1"}}, "lacks the key 'input'"),
    ],
)
def test_start_needs_an_explicit_input(
    client: FlaskClient, pikku: Pikku, kwargs: dict[str, Any], message: str
) -> None:
    """No body, or a body without "input", is a 400 naming the key; nothing is written."""
    response = client.post(ORDER_URL, **kwargs)
    assert response.status_code == 400, response.json
    assert response.json["error"] == "bad_request"
    assert message in response.json["message"]
    assert "'input'" in response.json["message"]
    assert '{"input": null}' in response.json["message"]
    assert pikku.store.list_runs() == []


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
        ({"json": {"input": {}, "timeout": 0}}, 400, "invalid_payload", "timeout"),
        ({"json": {"input": {}, "timeout": "soon"}}, 400, "invalid_payload", "timeout"),
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
    run_id = client.post(f"/api/workflows/{support.FLAKY}/runs", json={"input": None}).json["id"]
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


# --- the size limit -----------------------------------------------------------


class Untouchable(io.RawIOBase):
    """A request body that fails the test if anything reads it."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise AssertionError("the body was read")


class Endless(io.RawIOBase):
    """A JSON string body of ``size`` bytes, made as it is read; counts what was read."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.size - self.read_bytes)
        head = b'{"input": "'[self.read_bytes :]
        chunk = (head + b"x" * n)[:n]
        buffer[:n] = chunk
        self.read_bytes += n
        return n


def chunked(client: FlaskClient, url: str, body: io.RawIOBase) -> Any:
    """POST ``body`` as a server that de-chunks it hands it on: no Content-Length."""
    return client.post(
        url,
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input": body, "wsgi.input_terminated": True},
    )


def test_a_body_over_the_limit_is_413_before_it_is_read(
    client: FlaskClient, pikku: Pikku, permissions: Permissions
) -> None:
    response = client.post(
        ORDER_URL,
        content_type="application/json",
        environ_overrides={"wsgi.input": Untouchable(), "CONTENT_LENGTH": "30000000"},
    )
    assert response.status_code == 413
    assert response.json["error"] == "payload_too_large"
    limit = pikku.max_input_bytes + ENVELOPE_BYTES
    assert response.json["message"] == (
        f"the request body is 30000000 bytes, above the limit of {limit}"
    )
    assert permissions.calls == []  # refused before the hook, which might read the body
    assert pikku.store.list_runs() == []


def test_a_chunked_body_is_cut_off_at_the_limit(pikku: Pikku, permissions: Permissions) -> None:
    """No Content-Length (a chunked body): the read stops at the limit with a 413."""
    client = make_app(pikku, permissions, max_body_bytes=1000).test_client()
    body = Endless(30_000_000)
    response = chunked(client, ORDER_URL, body)
    assert response.status_code == 413
    assert response.json == {
        "error": "payload_too_large",
        "message": "the request body is larger than the limit of 1000 bytes",
    }
    assert body.read_bytes == 1001  # one byte past the limit, then no more
    assert pikku.store.list_runs() == []


def test_a_chunked_body_is_never_taken_cut_short(pikku: Pikku, permissions: Permissions) -> None:
    """Flask stops a bounded read quietly at its bound: ``12345`` would come as ``1234``."""
    client = make_app(pikku, permissions, max_body_bytes=4).test_client()
    run_id = pikku.start(support.ORDER, {"a": 1, "b": 2}).run_id
    url = f"/api/runs/{run_id}/signals/approval"
    version = pikku.handle(run_id).state().version
    response = chunked(client, url, io.BytesIO(b"12345"))
    assert (response.status_code, response.json["error"]) == (413, "payload_too_large")
    assert pikku.handle(run_id).state().version == version  # no signal
    response = chunked(client, url, io.BytesIO(b"1234"))  # exactly the limit
    assert response.status_code == 202, response.json
    support.run_scheduled_steps(pikku, run_id)
    pikku.orchestrate(run_id, "test")
    assert pikku.handle(run_id).wait(timeout=5) == {"total": 3, "approval": 1234}


def test_the_permission_hooks_reads_are_bounded_too(pikku: Pikku) -> None:
    def reads_the_body(action: str, target: str) -> bool:
        request.get_data()  # the first read stops just past the limit ...
        request.stream.read()  # ... and one more read past it is werkzeug's 413
        raise AssertionError("not reached")

    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(make_blueprint(permission=reads_the_body, max_body_bytes=10))
    body = Endless(30_000_000)
    response = chunked(app.test_client(), f"/workflows/{support.ORDER}/runs", body)
    assert response.status_code == 413
    assert response.json == {
        "error": "payload_too_large",
        "message": "the request body is larger than the limit of 10 bytes",
    }
    assert body.read_bytes == 11


def test_the_default_limit_is_the_engines_input_limit_and_the_envelope(
    pikku: Pikku, permissions: Permissions
) -> None:
    pikku.max_input_bytes = 100
    client = make_app(pikku, permissions).test_client()
    # Within the envelope's room: the engine itself refuses the input.
    response = start(client, {"input": "x" * 200})
    assert (response.status_code, response.json["error"]) == (400, "invalid_payload")
    response = start(client, {"input": "x" * (100 + ENVELOPE_BYTES)})
    assert (response.status_code, response.json["error"]) == (413, "payload_too_large")
    run_id = start(client, {"input": {"a": 1, "b": 2}}).json["id"]
    response = client.post(f"/api/runs/{run_id}/signals/approval", json="x" * ENVELOPE_BYTES * 2)
    assert (response.status_code, response.json["error"]) == (413, "payload_too_large")


def test_the_apps_max_content_length_caps_the_default_but_not_an_explicit_limit(
    pikku: Pikku, permissions: Permissions
) -> None:
    app = make_app(pikku, permissions)
    app.config["MAX_CONTENT_LENGTH"] = 500
    response = start(app.test_client(), {"input": "x" * 600})
    assert response.status_code == 413
    assert "above the limit of 500" in response.json["message"]

    app = make_app(pikku, permissions, max_body_bytes=10_000)
    app.config["MAX_CONTENT_LENGTH"] = 500
    response = start(app.test_client(), {"input": {"a": 1, "b": 2}, "idempotency_key": "x" * 600})
    assert response.status_code == 400  # past the size check: the key is too long
    assert response.json["error"] == "invalid_payload"
    with pytest.raises(ValueError, match="max_body_bytes"):
        make_blueprint(pikku, permission=permissions, max_body_bytes=-1)


# --- every error is JSON ------------------------------------------------------


def test_routing_errors_under_the_blueprint_are_json(client: FlaskClient) -> None:
    run_id = start(client).json["id"]
    for method, path, allowed in [
        ("GET", ORDER_URL, {"POST"}),
        ("DELETE", f"/api/runs/{run_id}", {"GET", "HEAD"}),
        ("GET", f"/api/runs/{run_id}/cancel", {"POST"}),
        ("PUT", f"/api/runs/{run_id}/signals/approval", {"POST"}),
    ]:
        response = client.open(path, method=method)
        assert response.status_code == 405, (method, path)
        assert response.json == {
            "error": "method_not_allowed",
            "message": f"{method} is not allowed on {path} (allowed: {response.headers['Allow']})",
        }
        assert allowed <= set(response.headers["Allow"].split(", "))
    for path in ["/api/runs", f"/api/runs/{run_id}/nope", "/api/workflows/x", "/api/nothing"]:
        response = client.get(path)
        assert response.status_code == 404, path
        assert response.json == {
            "error": "not_found",
            "message": f"no endpoint of the pikku-celery API at {path}",
        }


def test_the_apps_other_routes_keep_their_own_error_pages(
    pikku: Pikku, permissions: Permissions
) -> None:
    app = Flask(__name__)
    PikkuFlask(pikku, app)

    @app.post("/plain")
    def plain() -> str:
        return "ok"

    @app.errorhandler(404)
    def not_found(exc: Exception) -> tuple[str, int]:
        return "the app's own 404", 404

    other = Blueprint("other", __name__)

    @other.post("/thing")
    def thing() -> str:
        return "ok"

    app.register_blueprint(other, url_prefix="/api/other")
    app.register_blueprint(make_blueprint(permission=permissions), url_prefix="/api")
    client = app.test_client()

    response = client.get("/plain")
    assert response.status_code == 405
    assert response.mimetype == "text/html"
    response = client.get("/api/other/thing")
    assert response.status_code == 405
    assert response.mimetype == "text/html"
    for path in ["/nowhere", "/api/nothing"]:  # /api is shared: not the blueprint's alone
        response = client.get(path)
        assert (response.status_code, response.get_data(as_text=True)) == (
            404,
            "the app's own 404",
        )
    # The blueprint's own URLs still answer JSON, the app's 404 handler notwithstanding.
    response = client.get("/api/runs/x/nope")
    assert (response.status_code, response.json["error"]) == (404, "not_found")
    response = client.get(ORDER_URL)
    assert (response.status_code, response.json["error"]) == (405, "method_not_allowed")


def test_a_blueprint_at_the_root_claims_only_its_own_urls(pikku: Pikku) -> None:
    app = Flask(__name__)
    app.register_blueprint(make_blueprint(pikku, permission=lambda a, t: True))
    client = app.test_client()
    assert client.get("/nowhere").mimetype == "text/html"
    assert client.get("/runs/x/y").json["error"] == "not_found"
    assert client.get(f"/workflows/{support.ORDER}/runs").json["error"] == "method_not_allowed"


def test_a_bug_is_a_json_500_without_details(pikku: Pikku) -> None:
    def broken(action: str, target: str) -> bool:
        raise RuntimeError("secret detail")

    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(make_blueprint(permission=broken), url_prefix="/api")
    response = app.test_client().get(f"/api/runs/{uuid.uuid4()}")
    assert response.status_code == 500
    assert response.json == {
        "error": "internal_error",
        "message": "internal server error; the server's log has the details",
    }


# --- configuration ------------------------------------------------------------


def test_a_blueprint_needs_the_extension_first_or_its_pikku(pikku: Pikku) -> None:
    app = Flask(__name__)
    bp = make_blueprint(permission=lambda a, t: True)
    with pytest.raises(RuntimeError, match=r"call PikkuFlask\(pikku\)\.init_app\(app\)"):
        app.register_blueprint(bp, url_prefix="/api")
    assert not [r for r in app.url_map.iter_rules() if r.rule.startswith("/api")]

    app = Flask(__name__)
    PikkuFlask(pikku, app)
    app.register_blueprint(bp, url_prefix="/api")  # the same blueprint, now on a ready app
    response = start(app.test_client())
    assert response.status_code == 202, response.json


def test_an_app_that_lost_its_extension_answers_not_configured(
    pikku: Pikku, permissions: Permissions
) -> None:
    app = make_app(pikku, permissions)
    del app.extensions["pikku_celery"]
    response = start(app.test_client())
    assert response.status_code == 500
    assert response.json["error"] == "not_configured"
    assert "PikkuFlask(pikku).init_app(app)" in response.json["message"]


# --- a reused idempotency key -------------------------------------------------


def test_a_key_reused_with_another_input_is_409_naming_its_run(
    client: FlaskClient, pikku: Pikku
) -> None:
    first = start(client, {"input": {"a": 1, "b": 1}, "idempotency_key": "order-7"})
    assert first.status_code == 202, first.json
    response = start(client, {"input": {"a": 2, "b": 2}, "idempotency_key": "order-7"})
    assert response.status_code == 409, response.json
    assert response.json["error"] == "conflict"
    assert response.json["run_id"] == first.json["id"]
    assert "'order-7'" in response.json["message"]
    assert "different input" in response.json["message"]
    assert [r.id for r in pikku.store.list_runs()] == [first.json["id"]]


def test_status_lists_the_runs_progress_events_in_order(client: FlaskClient, pikku: Pikku) -> None:
    add = pikku.app.tasks["contrib.add"]

    @pikku.workflow(name="contrib.progress")
    def progress(ctx: Context, n: int) -> int:
        for i in range(n):
            ctx.step(f"add-{i}", add, i, 1)
            ctx.set_event("progress", {"done": i + 1, "of": n})
        return n

    run_id = pikku.start("contrib.progress", 2).run_id
    assert client.get(f"/api/runs/{run_id}").json["events"] == []
    while support.run_scheduled_steps(pikku, run_id):
        pass
    body = client.get(f"/api/runs/{run_id}").json
    assert body["status"] == "completed"
    assert [(e["key"], e["number"], e["value"]) for e in body["events"]] == [
        ("progress", 0, {"done": 1, "of": 2}),
        ("progress", 1, {"done": 2, "of": 2}),
    ]
    assert body["events"][0]["at"].endswith("Z")
