"""Every error a pikku Flask blueprint answers, in the API's one JSON shape.

Refusals of the API and of the library are answered as :func:`~.api.error_answer`
says; werkzeug's HTTP errors (a 404, a 405, a bug's 500) are mapped to a code
(:data:`HTTP_ERROR_CODES`); and Flask's routing errors for the blueprint's
URLs, which happen before any blueprint is chosen, are caught app-wide but
answered only for those URLs: the app's other routes keep their own pages.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound

from .api import ERRORS, ApiError, error_answer
from .flask_ext import NotConfiguredError
from .flask_routes import respond

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


def json_error(status: int, code: str, message: str) -> Response:
    """An error answer ``{"error": code, "message": ...}`` with its status."""
    response = jsonify(error=code, message=message)
    response.status_code = status
    return response


def http_error(exc: HTTPException) -> Response:
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
    response = json_error(status, code or "error", message)
    for header, value in exc.get_headers():
        if header.lower() != "content-type":
            response.headers[header] = value
    return response


def answer_errors_as_json(bp: Blueprint, too_large: Callable[[], str]) -> None:
    """Register on ``bp`` a JSON answer for every error its views and hooks raise.

    ``too_large()`` is the message of werkzeug's 413, raised by a read past
    the body's bound.
    """

    def on_http_error(exc: HTTPException) -> Response:
        if exc.code == 413:
            return json_error(413, "payload_too_large", too_large())
        return http_error(exc)

    for status in HTTP_ERROR_CODES:
        # By status, not only by class: the app's own handler of a status
        # would otherwise answer before the blueprint's class handler.
        bp.register_error_handler(status, on_http_error)
    bp.register_error_handler(HTTPException, on_http_error)

    def refused(exc: Exception) -> Response:
        answer = error_answer(exc)
        if answer is None:  # pragma: no cover - registered only for those classes
            raise exc
        return respond(answer)

    refusals: list[type[Exception]] = [ApiError, *ERRORS]
    for refusal in refusals:
        bp.register_error_handler(refusal, refused)

    def not_configured(exc: NotConfiguredError) -> Response:
        return json_error(500, "not_configured", str(exc))

    bp.register_error_handler(NotConfiguredError, not_configured)


def answer_routing_errors_as_json(
    bp: Blueprint, views: Collection[Callable[..., Any]], trees: tuple[str, ...], anchor: str
) -> None:
    """Answer Flask's 404 and 405 for ``bp``'s URLs in JSON.

    ``views`` are the blueprint's; ``trees`` the URL trees under its prefix
    that are wholly its own; ``anchor`` the rule of one of its views, which
    finds its prefix in each registration.
    """

    def ours(endpoint: str | None) -> bool:
        return endpoint is not None and current_app.view_functions.get(endpoint) in views

    def under_blueprint(path: str) -> bool:
        """Is ``path`` in one of the blueprint's trees, or under a ``url_prefix``
        that no other route of the app shares (of any registration)?"""
        rules = list(current_app.url_map.iter_rules())
        prefixes = {
            rule.rule[: -len(anchor)]
            for rule in rules
            if ours(rule.endpoint) and rule.rule.endswith(anchor)
        }
        for prefix in prefixes:
            owned = [prefix + tree for tree in trees]
            if prefix and not any(
                r.rule == prefix or r.rule.startswith(prefix + "/")
                for r in rules
                if not ours(r.endpoint)
            ):
                owned.append(prefix)
            if any(path == tree or path.startswith(tree + "/") for tree in owned):
                return True
        return False

    def routes_here(exc: MethodNotAllowed) -> bool:
        """Does one of the blueprint's views take the path with another method?"""
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
        exc = request.routing_exception
        if isinstance(exc, MethodNotAllowed) and routes_here(exc):
            return http_error(exc)
        if isinstance(exc, NotFound) and under_blueprint(request.path):
            return http_error(exc)
        return None
