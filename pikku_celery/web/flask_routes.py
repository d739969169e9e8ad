"""The run page's routes on a Flask blueprint: the page, its assets, its JSON API.

:func:`.flask_blueprint.make_blueprint` adds them with
``run_page=True``, so they share that blueprint's body limit (413 before a
byte is read) and its JSON error handling (a 404 under ``api/`` and
``assets/`` is JSON too); each route hands the request's values to
:class:`~.api.RunApi` and sends its answer back. Routes, under the
blueprint's prefix: ``/`` (the page), ``/assets/<name>``, ``/api/runs``,
``/api/runs/<id>``, ``/api/runs/<id>/cancel``, ``/api/runs/<id>/retry``,
``/api/runs/<id>/signals/<name>``, ``/api/runs/bulk/cancel``,
``/api/runs/bulk/retry``, ``/metrics`` (Prometheus).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Blueprint, Response, abort, jsonify, request, url_for

from ..model.values import Operator
from .api import Answer, Body, RunApi, request_operator
from .page import HTML_TYPE, PAGE_HEADERS, asset, render_page
from .permissions import LIST_TARGET

TREES = ("/api", "/assets")
"""URL trees (under the blueprint's prefix) whose every answer is JSON or an asset."""


def respond(answer: Answer) -> Response:
    """An :class:`~.api.Answer` as a Flask response."""
    response = jsonify(answer.body)
    response.status_code = answer.status
    for header, value in answer.headers:
        response.headers[header] = value
    return response


def request_body() -> Body:
    """The current request's body for the API, read through Flask (bounded by
    the blueprint's ``max_content_length``, cached for a hook that read it)."""
    return Body(
        request.content_length,
        request.mimetype or None,
        lambda n: request.get_data(cache=True)[:n],
    )


def default_operator() -> Operator:
    """The request's operator: the server's ``REMOTE_USER`` (else ``"api"``)
    at the client's address."""
    return request_operator(request.remote_user, request.remote_addr)


def add_run_page(
    bp: Blueprint, api: Callable[[], RunApi], operator: Callable[[], Operator] | None = None
) -> frozenset[Callable[..., Any]]:
    """Add the page, its assets and its API to ``bp``; the views added.

    ``api`` builds the request's :class:`~.api.RunApi` (its engine and body
    limit are the blueprint's); ``operator`` names who asks for an action,
    for the audit trail (default: ``REMOTE_USER`` or ``"api"``, and the
    client's address).
    """
    who = operator or default_operator

    @bp.get("/")
    def run_page() -> Response:
        """The page: the runs list, or one run's view with ``?run=<id>``."""
        root = url_for(".run_page")
        text = render_page(f"{root}api/", f"{root}assets/")
        return Response(text, content_type=HTML_TYPE, headers=list(PAGE_HEADERS))

    @bp.get("/assets/<name>")
    def run_page_asset(name: str) -> Response:
        """One of the page's own files (no other is served)."""
        found = asset(name)
        if found is None:
            abort(404)
        return Response(found.body, content_type=found.content_type, headers=list(PAGE_HEADERS))

    @bp.get("/metrics")
    def metrics() -> Response:
        """Prometheus' text format, read from the store (asks ``permission("list", "runs")``)."""
        from .metrics import render_metrics  # prometheus_client: the web extra

        run_api = api()
        refused = run_api.refusal("list", LIST_TARGET)
        if refused is not None:
            return respond(refused)
        store = run_api.engine.store
        body, content_type = run_api.read(lambda: render_metrics(store), "reading metrics")
        return Response(body, content_type=content_type)

    @bp.get("/api/runs")
    def api_runs() -> Response:
        """A page of runs with counts per status (query: see :mod:`.query`)."""
        return respond(api().runs(request.args.to_dict(flat=True)))

    @bp.get("/api/runs/<run_id>")
    def api_run(run_id: str) -> Response:
        """One run with a page of its steps, and what this request may do to it."""
        return respond(api().run(run_id, request.args.to_dict(flat=True)))

    @bp.post("/api/runs/bulk/cancel")
    def api_bulk_cancel() -> Response:
        """Cancel every live run the body's filter picks."""
        return respond(api().bulk("cancel", request_body(), who()))

    @bp.post("/api/runs/bulk/retry")
    def api_bulk_retry() -> Response:
        """Retry every failed run the body's filter picks."""
        return respond(api().bulk("retry", request_body(), who()))

    @bp.post("/api/runs/<run_id>/cancel")
    def api_cancel(run_id: str) -> Response:
        """Cancel the run (and its children)."""
        return respond(api().cancel(run_id, request_body(), who()))

    @bp.post("/api/runs/<run_id>/retry")
    def api_retry(run_id: str) -> Response:
        """Resume a failed run from its failed steps."""
        return respond(api().retry(run_id, request_body(), who()))

    @bp.post("/api/runs/<run_id>/signals/<name>")
    def api_signal(run_id: str, name: str) -> Response:
        """Deliver signal ``name`` with the body as its payload."""
        return respond(api().signal(run_id, name, request_body(), who()))

    views: list[Callable[..., Any]] = [run_page, run_page_asset, metrics, api_runs, api_run]
    views += [api_cancel, api_retry, api_signal, api_bulk_cancel, api_bulk_retry]
    return frozenset(views)
