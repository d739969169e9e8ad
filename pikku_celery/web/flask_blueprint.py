"""The Flask blueprint: thin views over :class:`~.workflow_api.WorkflowApi` and the run page's API.

Each view hands the request's values to the framework-neutral API and sends
its :class:`~.api.Answer` back, as Django's views do; what stays Flask's is
the blueprint's glue: the body's bound, checked before anything else, and
errors answered in JSON (:mod:`.flask_errors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, current_app, request, url_for
from flask.blueprints import BlueprintSetupState

from ..engine.core import WorkflowEngine
from ..model.values import Operator
from .api import ENVELOPE_BYTES, ApiError, RunApi, request_operator
from .flask_errors import answer_errors_as_json, answer_routing_errors_as_json
from .flask_ext import NOT_CONFIGURED, current_pikku, has_extension
from .flask_routes import TREES as RUN_PAGE_TREES
from .flask_routes import add_run_page, request_body, respond
from .permissions import Permission
from .workflow_api import WorkflowApi, body_too_large

_START_RULE = "/workflows/<name>/runs"
_OWN_TREES = ("/workflows", "/runs")


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
    """The JSON API over ``pikku`` (default: the app's :class:`~.flask_ext.PikkuFlask`).

    ``permission`` is required: an API that starts and cancels workflows
    must not be open by accident (pass ``lambda action, target: True`` to
    open it on purpose). ``tracebacks=True`` adds failed steps' tracebacks
    to status answers. ``max_body_bytes`` is the largest request body taken
    (413 past it); by default the engine's ``max_input_bytes`` plus
    :data:`~.api.ENVELOPE_BYTES`, capped by the app's ``MAX_CONTENT_LENGTH``.

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
    :class:`~.flask_ext.PikkuFlask` raises ``RuntimeError``.
    """
    if max_body_bytes is not None and max_body_bytes < 0:
        raise ValueError(f"max_body_bytes must be 0 or more, not {max_body_bytes}")
    bp = Blueprint(name, __name__, url_prefix=url_prefix)
    if pikku is None:
        bp.record(refuse_an_app_without_pikku)  # first, so a refused blueprint adds no routes

    def engine() -> WorkflowEngine:
        return pikku if pikku is not None else current_pikku()

    def body_limit() -> int:
        if max_body_bytes is not None:
            return max_body_bytes
        limit = engine().max_input_bytes + ENVELOPE_BYTES
        app_limit = current_app.config.get("MAX_CONTENT_LENGTH")
        return limit if app_limit is None else min(limit, app_limit)

    bp.before_request(lambda: bound_the_body(body_limit()))
    answer_errors_as_json(bp, lambda: body_too_large(body_limit()))

    def api() -> WorkflowApi:
        status_url = f"{request.blueprint}.run_status"
        return WorkflowApi(
            engine(),
            permission,
            max_body_bytes=body_limit(),
            location=lambda run_id: url_for(status_url, run_id=run_id),
            tracebacks=tracebacks,
        )

    def run_api() -> RunApi:
        return RunApi(engine(), permission, max_body_bytes=body_limit())

    operator = request_operators(identity)
    views: frozenset[Callable[..., Any]] = add_workflow_routes(bp, api, operator)
    trees: tuple[str, ...] = _OWN_TREES
    if run_page:
        views |= add_run_page(bp, run_api, operator)
        trees += RUN_PAGE_TREES
    answer_routing_errors_as_json(bp, views, trees, _START_RULE)
    return bp


def request_operators(identity: Callable[[], str | None] | None) -> Callable[[], Operator]:
    """Who asks, for the audit trail: ``identity()``, else ``REMOTE_USER``, else "api"."""

    def operator() -> Operator:
        user = identity() if identity is not None else request.remote_user
        return request_operator(user, request.remote_addr)

    return operator


def refuse_an_app_without_pikku(state: BlueprintSetupState) -> None:
    """Registering a blueprint made without a Pikku needs the app's
    :class:`~.flask_ext.PikkuFlask`."""
    if not has_extension(state.app):
        raise RuntimeError(f"cannot register blueprint {state.name!r}: {NOT_CONFIGURED}")


def bound_the_body(limit: int) -> None:
    """Refuse a body over ``limit`` by its Content-Length; bound any read to it."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(
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
    # app's MAX_CONTENT_LENGTH bound the read, and the API's read refuses.
    with contextlib.suppress(AttributeError):
        request.max_content_length = limit + 1


def add_workflow_routes(
    bp: Blueprint, api: Callable[[], WorkflowApi], operator: Callable[[], Operator]
) -> frozenset[Callable[..., Response]]:
    """Add start, status, signal and cancel to ``bp``; the views added."""

    @bp.post(_START_RULE)
    def start_run(name: str) -> Response:
        """Start a run of workflow ``name``; an idempotency key already used returns its run."""
        return respond(api().start(name, request_body()))

    @bp.get("/runs/<run_id>")
    def run_status(run_id: str) -> Response:
        """The run: status, output or error, and every step with its attempts."""
        return respond(api().status(run_id))

    @bp.post("/runs/<run_id>/signals/<name>")
    def send_signal(run_id: str, name: str) -> Response:
        """Deliver signal ``name`` with the body as its payload (no body: null)."""
        return respond(api().signal(run_id, name, request_body(), operator()))

    @bp.post("/runs/<run_id>/cancel")
    def cancel_run(run_id: str) -> Response:
        """Ask the run (and its children) to end as cancelled; a settled run is a 409."""
        return respond(api().cancel(run_id, operator()))

    return frozenset({start_run, run_status, send_signal, cancel_run})
