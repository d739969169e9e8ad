"""pikku-celery for Flask: an extension and an optional JSON blueprint.

::

    pikku_ext = PikkuFlask()           # module level

    def create_app() -> Flask:
        app = Flask(__name__)
        pikku_ext.init_app(app, pikku)  # app.extensions["pikku_celery"] is pikku_ext
        app.register_blueprint(
            make_blueprint(permission=lambda action, target: current_user.is_staff),
            url_prefix="/api",
        )
        return app

The blueprint's endpoints (all JSON in and out):

- ``POST /workflows/<name>/runs`` with ``{"input": ..., "idempotency_key": ...}``: start (202)
- ``GET /runs/<run_id>``: status, output or error, steps with their attempts
- ``POST /runs/<run_id>/signals/<name>`` with the payload as the body: signal (202)
- ``POST /runs/<run_id>/cancel``: ask the run to cancel (202)

Each first asks ``permission(action, target)`` (action ``"start"``,
``"status"``, ``"signal"`` or ``"cancel"``; target the workflow name or the
run id exactly as it appears in the path) and answers 403 when it says no.
It runs before anything is parsed or looked up, so a refused caller learns
nothing, not even whether the run exists; the hook can read ``flask.request``
for more (the signal's name is ``request.view_args["name"]``). Bad input is a
4xx with ``{"error": code, "message": ...}``, never a 500. The blueprint does
no CSRF protection: use token authentication, or put CSRF checks in front.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn

from flask import Blueprint, Flask, Response, current_app, jsonify, request, url_for

from ..engine.core import WorkflowEngine, parse_run_id
from ..errors import PayloadError, RunNotFoundError, RunSettledError, UnknownWorkflowError
from .summary import run_dict, run_summary

EXTENSION_KEY = "pikku_celery"

Permission = Callable[[str, str], bool]
"""``permission(action, target) -> bool``: may this request do ``action`` on ``target``?"""

START_KEYS = frozenset({"input", "idempotency_key"})


class PikkuFlask:
    """The Flask extension: makes a Pikku reachable from any view of the app.

    Usable directly (``PikkuFlask(pikku, app)``) or in the app-factory
    pattern (``ext = PikkuFlask(); ext.init_app(app, pikku)``).
    """

    def __init__(self, pikku: WorkflowEngine | None = None, app: Flask | None = None) -> None:
        self._pikku = pikku
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, pikku: WorkflowEngine | None = None) -> None:
        """Register with ``app`` as ``app.extensions["pikku_celery"]``."""
        if pikku is not None:
            self._pikku = pikku
        if self._pikku is None:
            raise RuntimeError(
                "PikkuFlask needs a Pikku: PikkuFlask(pikku) or init_app(app, pikku)"
            )
        app.extensions[EXTENSION_KEY] = self

    @property
    def pikku(self) -> WorkflowEngine:
        """The Pikku this extension serves."""
        if self._pikku is None:
            raise RuntimeError("PikkuFlask has no Pikku yet: call init_app(app, pikku)")
        return self._pikku


def current_pikku() -> WorkflowEngine:
    """The Pikku of the current Flask app (registered by :class:`PikkuFlask`)."""
    ext = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(ext, PikkuFlask):
        raise RuntimeError(
            "no PikkuFlask on this app: call PikkuFlask(pikku).init_app(app) "
            "or pass the Pikku to make_blueprint(pikku, ...)"
        )
    return ext.pikku


class ApiError(Exception):
    """A 4xx answer with a JSON body ``{"error": code, "message": message}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _fail(status: int, code: str, message: str) -> NoReturn:
    raise ApiError(status, code, message)


def _json_body(default: Any) -> Any:
    """The request body as JSON; ``default`` when there is none.

    A body must be declared JSON: a browser form (``text/plain``,
    ``application/x-www-form-urlencoded``) is refused with 415.
    """
    raw = request.get_data(cache=True)
    if not raw.strip():
        return default
    if not request.is_json:
        _fail(
            415,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json "
            f"(got {request.mimetype or 'no content type'})",
        )
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(400, "invalid_json", f"the request body is not valid JSON: {exc}")


def _run_id(raw: str) -> str:
    try:
        return parse_run_id(raw)
    except ValueError as exc:
        _fail(400, "invalid_run_id", str(exc))


def make_blueprint(
    pikku: WorkflowEngine | None = None,
    *,
    permission: Permission,
    name: str = "pikku_celery",
    url_prefix: str | None = None,
    tracebacks: bool = False,
) -> Blueprint:
    """The JSON API over ``pikku`` (default: the app's :class:`PikkuFlask`).

    ``permission`` is required: an API that starts and cancels workflows
    must not be open by accident (pass ``lambda action, target: True`` to
    open it on purpose). ``tracebacks=True`` adds failed steps' tracebacks
    to status answers.
    """
    bp = Blueprint(name, __name__, url_prefix=url_prefix)

    def engine() -> WorkflowEngine:
        return pikku if pikku is not None else current_pikku()

    def allow(action: str, target: str) -> None:
        if not permission(action, target):
            _fail(403, "forbidden", f"not allowed to {action} {target!r}")

    @bp.errorhandler(ApiError)
    def api_error(exc: ApiError) -> tuple[Response, int]:
        return jsonify(error=exc.code, message=exc.message), exc.status

    @bp.errorhandler(UnknownWorkflowError)
    def unknown_workflow(exc: UnknownWorkflowError) -> tuple[Response, int]:
        return jsonify(error="unknown_workflow", message=str(exc)), 404

    @bp.errorhandler(RunNotFoundError)
    def unknown_run(exc: RunNotFoundError) -> tuple[Response, int]:
        return jsonify(error="unknown_run", message=str(exc)), 404

    @bp.errorhandler(RunSettledError)
    def settled(exc: RunSettledError) -> tuple[Response, int]:
        return jsonify(error="run_settled", message=str(exc)), 409

    @bp.errorhandler(PayloadError)
    def bad_payload(exc: PayloadError) -> tuple[Response, int]:
        return jsonify(error="invalid_payload", message=str(exc)), 400

    def accepted(run_id: str, body: dict[str, Any]) -> tuple[Response, int, dict[str, str]]:
        location = url_for(f"{bp.name}.run_status", run_id=run_id)
        return jsonify(body), 202, {"Location": location}

    @bp.post("/workflows/<name>/runs")
    def start_run(name: str) -> tuple[Response, int, dict[str, str]]:
        """Start a run of workflow ``name``; an idempotency key already used returns its run."""
        allow("start", name)
        body = _json_body(default={})
        if not isinstance(body, dict):
            _fail(
                400,
                "invalid_body",
                'the body must be a JSON object: {"input": ..., "idempotency_key": ...}',
            )
        unknown = sorted(set(body) - START_KEYS)
        if unknown:
            _fail(
                400,
                "invalid_body",
                f"unknown key(s) {', '.join(map(repr, unknown))}; "
                "expected 'input' and optionally 'idempotency_key'",
            )
        handle = engine().start(
            name, body.get("input"), idempotency_key=body.get("idempotency_key")
        )
        return accepted(handle.run_id, run_summary(handle, tracebacks=tracebacks))

    @bp.get("/runs/<run_id>")
    def run_status(run_id: str) -> Response:
        """The run: status, output or error, and every step with its attempts."""
        allow("status", run_id)
        handle = engine().handle(_run_id(run_id))
        return jsonify(run_summary(handle, tracebacks=tracebacks))

    @bp.post("/runs/<run_id>/signals/<name>")
    def send_signal(run_id: str, name: str) -> tuple[Response, int, dict[str, str]]:
        """Deliver signal ``name`` with the body as its payload (no body: null)."""
        allow("signal", run_id)
        rid = _run_id(run_id)
        payload = _json_body(default=None)
        run = engine().send_signal(rid, name, payload)
        return accepted(run.id, run_dict(run, tracebacks=tracebacks))

    @bp.post("/runs/<run_id>/cancel")
    def cancel_run(run_id: str) -> tuple[Response, int, dict[str, str]]:
        """Ask the run (and its children) to end as cancelled; a settled run is a 409."""
        allow("cancel", run_id)
        run = engine().cancel(_run_id(run_id))
        return accepted(run.id, run_dict(run, tracebacks=tracebacks))

    return bp
