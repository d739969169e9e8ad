"""pikku-celery for Flask: an extension and an optional JSON blueprint.

::

    pikku_ext = PikkuFlask()           # module level

    def create_app() -> Flask:
        app = Flask(__name__)
        pikku_ext.init_app(app, pikku)  # app.extensions["pikku_celery"] is pikku_ext
        app.register_blueprint(         # after init_app, or make_blueprint(pikku, ...)
            make_blueprint(permission=lambda action, target: current_user.is_staff),
            url_prefix="/api",
        )
        return app

A blueprint made without a Pikku serves the app's :class:`PikkuFlask`, so
registering it on an app that has none raises ``RuntimeError`` at once
(initialise the extension first, or pass the Pikku to ``make_blueprint``).

The blueprint's endpoints (all JSON in and out):

- ``POST /workflows/<name>/runs`` with ``{"input": ..., "idempotency_key": ...}``:
  start (202). ``"input"`` is required (``{"input": null}`` for none);
  ``"idempotency_key"`` is optional, and a key already used returns its run,
  or 409 ``conflict`` (with that ``run_id``) when the input differs.
- ``GET /runs/<run_id>``: status, output or error, steps with their attempts
- ``POST /runs/<run_id>/signals/<name>`` with the payload as the body (none: null):
  signal (202)
- ``POST /runs/<run_id>/cancel``: ask the run to cancel (202; a settled run is 409)

A 202 carries the run as JSON and its status URL as ``Location``.

``make_blueprint(..., run_page=True)`` adds the run page: ``/`` (the page,
``?run=<id>`` for one run), ``/assets/<name>`` and its JSON API under
``/api/`` (runs list with counts, one run whole, cancel, retry, signal; see
:mod:`pikku_celery.web.api`), on this blueprint's hook, body limit and error
handling.

A request body over the size limit is refused with 413 before any of it is
read, and before anything else: the limit is ``make_blueprint(max_body_bytes=...)``,
by default the engine's ``max_input_bytes`` plus room for the envelope (and
no more than the app's ``MAX_CONTENT_LENGTH`` when that is set). A body sent
chunked, without a ``Content-Length``, is refused as soon as its read
passes the limit.

Each endpoint then asks ``permission(action, target)`` (action ``"start"``,
``"status"``, ``"signal"`` or ``"cancel"``; target the workflow name or the
run id exactly as it appears in the path) and answers 403 when it says no.
It runs before the body is parsed or anything is looked up, so a refused
caller learns nothing, not even whether the run exists; the hook can read
``flask.request`` for more (the signal's name is ``request.view_args["name"]``).

Every error the blueprint answers is JSON ``{"error": code, "message": ...}``
with its status, never Flask's HTML page: bad input is a 4xx (400
``bad_request``, ``invalid_body``, ``invalid_json``, ``invalid_payload`` or
``invalid_run_id``; 403 ``forbidden``; 404 ``unknown_workflow`` or
``unknown_run``; 409 ``run_settled`` or ``conflict``; 413
``payload_too_large``; 415 ``unsupported_media_type``), never a 500. A
database that stays unreachable for the engine's ``outage_timeout`` is 503
``store_unavailable`` with ``Retry-After`` (see ``docs/outages.md``). A path
under the blueprint that matches no endpoint is 404 ``not_found``, a method
an endpoint does not take is 405 ``method_not_allowed`` (with ``Allow``);
the app's other routes keep their own error pages. A bug is 500
``internal_error`` (details in the server's log, not the answer); a
blueprint whose app lost its :class:`PikkuFlask` is 500 ``not_configured``.
The blueprint does no CSRF protection: use token authentication, or put
CSRF checks in front.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any, NoReturn

from flask import Blueprint, Flask, Response, current_app, jsonify, request, url_for
from flask.blueprints import BlueprintSetupState
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from ..engine.core import WorkflowEngine, parse_run_id
from ..payload import parse_json
from ..store.model import Operator
from ..web.api import ENVELOPE_BYTES, ERRORS, ApiError, RunApi, error_answer, request_operator
from ..web.flask_routes import TREES as RUN_PAGE_TREES
from ..web.flask_routes import add_run_page, respond
from .summary import run_dict, run_summary

EXTENSION_KEY = "pikku_celery"

Permission = Callable[[str, str], bool]
"""``permission(action, target) -> bool``: may this request do ``action`` on ``target``?"""

START_KEYS = frozenset({"input", "idempotency_key"})


HTTP_ERROR_CODES = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    500: "internal_error",
}
"""The ``"error"`` code of each HTTP status the blueprint answers itself."""

_START_RULE = "/workflows/<name>/runs"
_OWN_TREES = ("/workflows", "/runs")


class NotConfiguredError(RuntimeError):
    """The app has no :class:`PikkuFlask` for a blueprint made without a Pikku."""


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


_NOT_CONFIGURED = (
    "no PikkuFlask on this app: call PikkuFlask(pikku).init_app(app) or "
    "PikkuFlask(pikku, app) before registering the blueprint, "
    "or pass the Pikku to make_blueprint(pikku, ...)"
)


def current_pikku() -> WorkflowEngine:
    """The Pikku of the current Flask app (registered by :class:`PikkuFlask`).

    Raises :class:`NotConfiguredError` (a ``RuntimeError``) when there is none.
    """
    ext = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(ext, PikkuFlask):
        raise NotConfiguredError(_NOT_CONFIGURED)
    return ext.pikku


def _fail(status: int, code: str, message: str) -> NoReturn:
    raise ApiError(status, code, message)


def _too_large(limit: int) -> str:
    """The 413's message for a body (of unknown length) over ``limit`` bytes."""
    return f"the request body is larger than the limit of {limit} bytes"


def _json_body(limit: int) -> Any:
    """The request body as JSON; ``None`` when there is none.

    A body must be declared JSON: a browser form (``text/plain``,
    ``application/x-www-form-urlencoded``) is refused with 415. The read
    stops one byte past ``limit`` (``request.max_content_length``, set by
    the blueprint); a body that long is refused with 413.
    """
    raw = request.get_data(cache=True)
    if len(raw) > limit:
        _fail(413, "payload_too_large", _too_large(limit))
    if not raw.strip():
        return None
    if not request.is_json:
        _fail(
            415,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json "
            f"(got {request.mimetype or 'no content type'})",
        )
    try:
        return parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        _fail(400, "invalid_json", f"the request body is not valid JSON: {exc}")


def _run_id(raw: str) -> str:
    try:
        return parse_run_id(raw)
    except ValueError as exc:
        _fail(400, "invalid_run_id", str(exc))


def _error(status: int, code: str, message: str, **extra: Any) -> tuple[Response, int]:
    return jsonify(error=code, message=message, **extra), status


def _http_error(exc: HTTPException) -> Response:
    """A werkzeug HTTP error (routing, a bug's 500...) in the JSON shape."""
    status = exc.code or 500
    code = HTTP_ERROR_CODES.get(status) or re.sub(r"\W+", "_", (exc.name or "").lower())
    message = exc.description or exc.name or "error"
    if isinstance(exc, MethodNotAllowed):
        allowed = ", ".join(exc.valid_methods or ())
        message = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
    elif isinstance(exc, NotFound):
        message = f"no endpoint of the pikku-celery API at {request.path}"
    elif status == 500:
        message = "internal server error; the server's log has the details"
    response, _ = _error(status, code or "error", message)
    response.status_code = status
    for header, value in exc.get_headers():
        if header.lower() != "content-type":
            response.headers[header] = value
    return response


def make_blueprint(
    pikku: WorkflowEngine | None = None,
    *,
    permission: Permission,
    name: str = "pikku_celery",
    url_prefix: str | None = None,
    tracebacks: bool = False,
    max_body_bytes: int | None = None,
    run_page: bool = False,
    identity: Callable[[], str | None] | None = None,
) -> Blueprint:
    """The JSON API over ``pikku`` (default: the app's :class:`PikkuFlask`).

    ``permission`` is required: an API that starts and cancels workflows
    must not be open by accident (pass ``lambda action, target: True`` to
    open it on purpose). ``tracebacks=True`` adds failed steps' tracebacks
    to status answers. ``max_body_bytes`` is the largest request body taken
    (413 past it); by default the engine's ``max_input_bytes`` plus
    :data:`ENVELOPE_BYTES`, capped by the app's ``MAX_CONTENT_LENGTH``.

    ``run_page=True`` adds the run page (:mod:`pikku_celery.web`) at the
    blueprint's root, its assets under ``assets/`` and its JSON API under
    ``api/``, behind the same hook (actions ``"list"``, ``"status"``,
    ``"cancel"``, ``"retry"``, ``"signal"``; see
    :mod:`pikku_celery.web.permissions`), body limit and error handling. The
    run page shows errors whole, tracebacks included, to whoever the hook
    lets read.

    Every cancel, retry and signal is kept in the run's audit trail with
    who asked and from where: ``identity()`` names the request's user (e.g.
    ``lambda: current_user.get_id()``, the user your permission hook
    checks); without it, the server's ``REMOTE_USER`` (an authenticating
    front server), else ``"api"``; the client's address is
    ``request.remote_addr``.

    Without ``pikku``, registering the blueprint on an app that has no
    :class:`PikkuFlask` raises ``RuntimeError``.
    """
    if max_body_bytes is not None and max_body_bytes < 0:
        raise ValueError(f"max_body_bytes must be 0 or more, not {max_body_bytes}")
    bp = Blueprint(name, __name__, url_prefix=url_prefix)

    def check_configured(state: BlueprintSetupState) -> None:
        if pikku is None and not isinstance(state.app.extensions.get(EXTENSION_KEY), PikkuFlask):
            raise RuntimeError(f"cannot register blueprint {state.name!r}: {_NOT_CONFIGURED}")

    bp.record(check_configured)  # first, so a refused blueprint adds no routes

    def engine() -> WorkflowEngine:
        return pikku if pikku is not None else current_pikku()

    def operator() -> Operator:
        user = identity() if identity is not None else request.remote_user
        return request_operator(user, request.remote_addr)

    def allow(action: str, target: str) -> None:
        if not permission(action, target):
            _fail(403, "forbidden", f"not allowed to {action} {target!r}")

    def body_limit() -> int:
        if max_body_bytes is not None:
            return max_body_bytes
        limit = engine().max_input_bytes + ENVELOPE_BYTES
        app_limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return limit if app_limit is None else min(limit, app_limit)

    @bp.before_request
    def limit_the_body() -> None:
        """Refuse a body over the limit by its Content-Length; bound any read to it."""
        limit = body_limit()
        if request.content_length is not None and request.content_length > limit:
            _fail(
                413,
                "payload_too_large",
                f"the request body is {request.content_length} bytes, above the limit of {limit}",
            )
        # Bound every read of the body in this request (ours, the permission
        # hook's), a chunked one without Content-Length too. One byte past
        # the limit: werkzeug's read stops quietly at its bound, so a longer
        # body would come cut short (and "12345" cut is still JSON); one that
        # reaches limit + 1 is known to be too long. Flask 3.0 cannot set it
        # per request: there only the Content-Length check above and the
        # app's MAX_CONTENT_LENGTH bound the read, and _json_body refuses.
        with contextlib.suppress(AttributeError):
            request.max_content_length = limit + 1

    def http_error(exc: HTTPException) -> Response | tuple[Response, int]:
        if exc.code == 413:  # werkzeug's, for a read past the bound set above
            return _error(413, "payload_too_large", _too_large(body_limit()))
        return _http_error(exc)

    for status in HTTP_ERROR_CODES:
        # By status, not only by class: the app's own handler of a status
        # would otherwise answer before the blueprint's class handler.
        bp.register_error_handler(status, http_error)
    bp.register_error_handler(HTTPException, http_error)

    def refused(exc: Exception) -> Response:
        """An ApiError, or a refusal of the library, in the API's one shape
        (``web.api.ERRORS``: the run page's API answers the same)."""
        answer = error_answer(exc)
        if answer is None:  # pragma: no cover - registered only for those classes
            raise exc
        return respond(answer)

    refusals: list[type[Exception]] = [ApiError, *ERRORS]
    for refusal in refusals:
        bp.register_error_handler(refusal, refused)

    @bp.errorhandler(NotConfiguredError)
    def not_configured(exc: NotConfiguredError) -> tuple[Response, int]:
        return _error(500, "not_configured", str(exc))

    def accepted(run_id: str, body: dict[str, Any]) -> tuple[Response, int, dict[str, str]]:
        location = url_for(f"{request.blueprint}.run_status", run_id=run_id)
        return jsonify(body), 202, {"Location": location}

    @bp.post("/workflows/<name>/runs")
    def start_run(name: str) -> tuple[Response, int, dict[str, str]]:
        """Start a run of workflow ``name``; an idempotency key already used returns its run."""
        allow("start", name)
        body = _json_body(body_limit())
        if body is None:
            _fail(
                400,
                "bad_request",
                "the request has no body; send a JSON object with the key 'input': "
                '{"input": ..., "idempotency_key": ...} ({"input": null} for no input)',
            )
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
        if "input" not in body:
            _fail(
                400,
                "bad_request",
                "the body lacks the key 'input': send "
                '{"input": ..., "idempotency_key": ...} ({"input": null} for no input)',
            )
        handle = engine().start(name, body["input"], idempotency_key=body.get("idempotency_key"))
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
        payload = _json_body(body_limit())
        run = engine().send_signal(rid, name, payload, by=operator())
        return accepted(run.id, run_dict(run, tracebacks=tracebacks))

    @bp.post("/runs/<run_id>/cancel")
    def cancel_run(run_id: str) -> tuple[Response, int, dict[str, str]]:
        """Ask the run (and its children) to end as cancelled; a settled run is a 409."""
        allow("cancel", run_id)
        run = engine().cancel(_run_id(run_id), by=operator())
        return accepted(run.id, run_dict(run, tracebacks=tracebacks))

    views = frozenset({start_run, run_status, send_signal, cancel_run})
    own_trees: tuple[str, ...] = _OWN_TREES
    if run_page:
        views |= add_run_page(
            bp, lambda: RunApi(engine(), permission, max_body_bytes=body_limit()), operator
        )
        own_trees += RUN_PAGE_TREES

    def ours(endpoint: str | None) -> bool:
        return endpoint is not None and current_app.view_functions.get(endpoint) in views

    def under_blueprint(path: str) -> bool:
        """Is ``path`` in one of this blueprint's URL trees (of any registration)?

        Its ``/workflows/...`` and ``/runs/...``, and the whole of a
        ``url_prefix`` that no other route of the app shares.
        """
        rules = list(current_app.url_map.iter_rules())
        prefixes = {
            rule.rule[: -len(_START_RULE)]
            for rule in rules
            if ours(rule.endpoint) and rule.rule.endswith(_START_RULE)
        }
        for prefix in prefixes:
            trees = [prefix + tree for tree in own_trees]
            if prefix and not any(
                r.rule == prefix or r.rule.startswith(prefix + "/")
                for r in rules
                if not ours(r.endpoint)
            ):
                trees.append(prefix)
            if any(path == tree or path.startswith(tree + "/") for tree in trees):
                return True
        return False

    def routes_here(exc: MethodNotAllowed) -> bool:
        """Does one of this blueprint's endpoints take the path with another method?"""
        adapter = current_app.create_url_adapter(request)
        if adapter is None:  # pragma: no cover - there is one for every request
            return False
        for method in exc.valid_methods or ():
            try:
                rule, _args = adapter.match(method=method, return_rule=True)
            except HTTPException:
                continue
            if ours(rule.endpoint):
                return True
        return False

    @bp.before_app_request
    def routing_errors_as_json() -> Response | None:
        """Flask routes before any blueprint is chosen, so its 404 and 405 for
        this blueprint's URLs are caught here, app-wide but only for those
        URLs: the app's other routes keep their own error pages."""
        exc = request.routing_exception
        if isinstance(exc, MethodNotAllowed) and routes_here(exc):
            return _http_error(exc)
        if isinstance(exc, NotFound) and under_blueprint(request.path):
            return _http_error(exc)
        return None

    return bp
