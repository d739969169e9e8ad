"""The run page's views for Django: each hands the request to the shared API.

The routes (:mod:`.urls`) are those of the standalone page and the Flask
blueprint, answered by the same :class:`~pikku_celery.web.api.RunApi`: the
page, its assets, its JSON API and ``metrics``, with the same checks in the same order
(413 before the body is read, then the permission hook, then the run id).

The hook is ``permission(action, target) -> bool`` as everywhere;
:func:`current_request` gives it the Django request (its ``user``). Without
one, :func:`staff_permission` decides: active staff users read, superusers
also cancel, retry and signal. Set ``PIKKU_CELERY_PERMISSION`` to the dotted
path of your own hook, or pass it to :func:`~.urls.run_page_urls`.

Actions are POSTs under Django's CSRF protection: the page sends the token
(``X-CSRFToken``) it is rendered with. Each is kept in the run's audit trail
as done by the request's user (``user.get_username()``; ``"api"`` for an
anonymous one) from the client's address (``REMOTE_ADDR``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.middleware.csrf import get_token

from ...engine.core import WorkflowEngine
from ...errors import StoreUnavailableError
from ...model.values import Operator
from ...web.api import Answer, Body, RunApi, error_answer, failure, request_operator
from ...web.page import HTML_TYPE, PAGE_HEADERS, asset, render_page
from ...web.permissions import LIST_TARGET, READ_ACTIONS, Permission

PERMISSION_SETTING = "PIKKU_CELERY_PERMISSION"
"""The setting naming the hook (a dotted path, or the callable itself)."""

_request: ContextVar[HttpRequest | None] = ContextVar("pikku_celery_request", default=None)

View = Callable[..., HttpResponse]


def current_request() -> HttpRequest:
    """The request the run page's view is answering (for a permission hook).

    Raises ``LookupError`` outside one.
    """
    request = _request.get()
    if request is None:
        raise LookupError("no run page request is being answered here")
    return request


@contextmanager
def _answering(request: HttpRequest) -> Iterator[None]:
    token = _request.set(request)
    try:
        yield
    finally:
        _request.reset(token)


def staff_permission(action: str, target: str) -> bool:
    """The default hook: active staff may read, active superusers may also steer.

    With no ``request.user`` (no authentication middleware) nobody may do anything.
    """
    user = getattr(current_request(), "user", None)
    if user is None or not getattr(user, "is_active", False):
        return False
    if action in READ_ACTIONS:
        return bool(getattr(user, "is_staff", False))
    return bool(getattr(user, "is_superuser", False))


def configured_permission() -> Permission:
    """``settings.PIKKU_CELERY_PERMISSION`` (a dotted path or a callable), else
    :func:`staff_permission`; read at each request, so tests can override it."""
    from .conf import import_object

    hook = getattr(settings, PERMISSION_SETTING, None)
    if hook is None:
        return staff_permission
    found = import_object(hook) if isinstance(hook, str) else hook
    if not callable(found):
        raise TypeError(f"settings.{PERMISSION_SETTING} must name a callable, not {found!r}")
    return found  # type: ignore[no-any-return]


def _json(answer: Answer) -> HttpResponse:
    response = JsonResponse(answer.body, status=answer.status, safe=False)
    for header, value in answer.headers:
        response[header] = value
    return response


def _body(request: HttpRequest) -> Body:
    raw = request.META.get("CONTENT_LENGTH") or ""
    length = int(raw) if raw.isascii() and raw.isdigit() else None
    return Body(length, request.content_type or None, request.read)


def _methods(**handlers: View) -> View:
    """One view answering the given methods; any other is a JSON 405 with ``Allow``."""
    allowed = ", ".join(sorted(m.upper() for m in handlers))

    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        handler = handlers.get((request.method or "").lower())
        if handler is None:
            response = _json(
                failure(
                    405,
                    "method_not_allowed",
                    f"{request.method} is not allowed on {request.path} (allowed: {allowed})",
                )
            )
            response["Allow"] = allowed
            return response
        return handler(request, *args, **kwargs)

    return view


def request_user(request: HttpRequest) -> Operator:
    """Who asks, for the audit trail: the signed-in user's name, else "api";
    from the client's address."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else None
    return request_operator(name, request.META.get("REMOTE_ADDR"))


class RunPageViews:
    """The run page's views over ``pikku`` (default: ``get_pikku()``) behind
    ``permission`` (default: :func:`configured_permission`, per request)."""

    def __init__(
        self,
        permission: Permission | None = None,
        *,
        pikku: WorkflowEngine | None = None,
        max_body_bytes: int | None = None,
    ) -> None:
        self.permission = permission
        self.pikku = pikku
        self.max_body_bytes = max_body_bytes
        self.page = _methods(get=self._page)
        self.asset = _methods(get=self._asset)
        self.runs = _methods(get=self._runs)
        self.run = _methods(get=self._run)
        self.cancel = _methods(post=self._cancel)
        self.retry = _methods(post=self._retry)
        self.signal = _methods(post=self._signal)
        self.bulk = _methods(post=self._bulk)
        self.metrics = _methods(get=self._metrics)

    def api(self) -> RunApi:
        """The API for this request: the Pikku, the hook and the body limit."""
        from .conf import get_pikku

        return RunApi(
            self.pikku if self.pikku is not None else get_pikku(),
            self.permission if self.permission is not None else configured_permission(),
            max_body_bytes=self.max_body_bytes,
        )

    def _call(self, request: HttpRequest, work: Callable[[RunApi], Answer]) -> HttpResponse:
        with _answering(request):
            return _json(work(self.api()))

    def _page(self, request: HttpRequest) -> HttpResponse:
        root = request.path
        if not root.endswith("/"):
            return HttpResponseRedirect(root + "/")
        text = render_page(f"{root}api/", f"{root}assets/", csrf_token=get_token(request))
        response = HttpResponse(text, content_type=HTML_TYPE)
        for header, value in PAGE_HEADERS:
            response[header] = value
        return response

    def _asset(self, request: HttpRequest, name: str) -> HttpResponse:
        found = asset(name)
        if found is None:
            return self.not_found(request)
        response = HttpResponse(found.body, content_type=found.content_type)
        for header, value in PAGE_HEADERS:
            response[header] = value
        return response

    def _runs(self, request: HttpRequest) -> HttpResponse:
        query = {key: request.GET[key] for key in request.GET}
        return self._call(request, lambda api: api.runs(query))

    def _run(self, request: HttpRequest, run_id: str) -> HttpResponse:
        query = {key: request.GET[key] for key in request.GET}
        return self._call(request, lambda api: api.run(run_id, query))

    def _cancel(self, request: HttpRequest, run_id: str) -> HttpResponse:
        who = request_user(request)
        return self._call(request, lambda api: api.cancel(run_id, _body(request), who))

    def _retry(self, request: HttpRequest, run_id: str) -> HttpResponse:
        who = request_user(request)
        return self._call(request, lambda api: api.retry(run_id, _body(request), who))

    def _signal(self, request: HttpRequest, run_id: str, name: str) -> HttpResponse:
        who = request_user(request)
        return self._call(request, lambda api: api.signal(run_id, name, _body(request), who))

    def _bulk(self, request: HttpRequest, action: str) -> HttpResponse:
        who = request_user(request)
        return self._call(request, lambda api: api.bulk(action, _body(request), who))

    def _metrics(self, request: HttpRequest) -> HttpResponse:
        """Prometheus' text format, read from the store (asks ``permission("list", "runs")``)."""
        from ...web.metrics import render_metrics  # prometheus_client: the web extra

        with _answering(request):
            api = self.api()
            refused = api.refusal("list", LIST_TARGET)
            if refused is not None:
                return _json(refused)
            store = api.engine.store
            try:
                body, content_type = api.read(lambda: render_metrics(store), "reading metrics")
            except StoreUnavailableError as exc:
                return _json(error_answer(exc) or failure(503, "store_unavailable", str(exc)))
        return HttpResponse(body, content_type=content_type)

    def not_found(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        """A JSON 404 for a path under the page's ``api/`` and ``assets/``."""
        return _json(failure(404, "not_found", f"no endpoint of the run page at {request.path}"))
