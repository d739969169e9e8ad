"""The run page's JSON API, framework-neutral: request values in, (status, body) out.

:class:`RunApi` over a Pikku (a :class:`~pikku_celery.engine.core.WorkflowEngine`)
and a permission hook (:mod:`.permissions`) answers every route of the
page; Flask (:mod:`.flask_routes`) and Django
(:mod:`pikku_celery.contrib.django.views`) only hand it the request's values
and send its :class:`Answer` back. Its routes, as those adapters mount them:

- ``GET  api/runs?status=&workflow=&since=&until=&q=&limit=&offset=``: a page
  of runs, newest first, with ``counts`` per status (:mod:`.query`);
- ``GET  api/runs/<id>?steps_after=&steps_limit=``: the run, a page of its
  steps with their attempts (``next_steps`` starts the next), signals,
  timers, children, progress events, and ``actions`` (what this request may
  do to it now);
- ``POST api/runs/<id>/cancel``, ``.../retry`` with ``{}``, and
  ``.../signals/<name>`` with the payload: 202 with the run;
- ``POST api/runs/bulk/cancel``, ``api/runs/bulk/retry`` with a filter
  (:mod:`.bulk`): 202 with the runs acted on (200 for a dry run).

Every check runs before anything is read or looked up, in this order: a
body whose ``Content-Length`` is over the limit is 413 before a byte of it
is read; then the permission hook (403); then the run id (400). An action's
body must be sent as ``application/json`` (415 otherwise): a browser form
cannot send that to another site, so a page elsewhere cannot steer runs
through a visitor's browser. A refused request changes nothing stored.
Errors are ``{"error": code, "message": ...}``, as the Flask blueprint's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..engine.bulk import BulkAction, act_on_runs, pick_runs
from ..engine.outage import ride_out
from ..engine.prune import describe_retention
from ..errors import (
    IdempotencyKeyReusedError,
    InvalidIdError,
    PayloadError,
    RunNotFoundError,
    RunSettledError,
    SignalAlreadySentError,
    StoreUnavailableError,
    UnknownWorkflowError,
)
from ..model.values import Operator, RunState, RunStatus
from ..names import check_id
from ..payload import parse_json
from . import reads
from .bulk import bulk_body, parse_bulk
from .permissions import LIST_TARGET, Permission, allowed_actions
from .query import QueryError, parse_run_query, parse_steps_query
from .shapes import run_detail

if TYPE_CHECKING:
    from ..engine.core import WorkflowEngine

ENVELOPE_BYTES = 64 * 1024
"""What a body may hold beyond the engine's ``max_input_bytes``.

The engine counts a signal's payload (or a start's input) as compact JSON;
the rest is room for the JSON around it, a client's indentation and ``\\u``
escapes. A larger body could hardly carry a value the engine would take, so
it is refused unread.
"""

NO_STORE = (("Cache-Control", "no-store"),)
"""Every answer is the store's state now: never cached (the page polls)."""

ERRORS: dict[type[Exception], tuple[int, str]] = {
    InvalidIdError: (400, "invalid_run_id"),
    PayloadError: (400, "invalid_payload"),
    RunNotFoundError: (404, "unknown_run"),
    UnknownWorkflowError: (404, "unknown_workflow"),
    RunSettledError: (409, "run_settled"),
    SignalAlreadySentError: (409, "signal_already_sent"),
    IdempotencyKeyReusedError: (409, "conflict"),
    StoreUnavailableError: (503, "store_unavailable"),
}
"""The status and ``"error"`` code each refusal of the library answers with."""

RETRY_AFTER_SECONDS = 5
"""What a 503 tells the client to wait before asking again: a database
restart is over by then, a longer outage is asked about again."""

T = TypeVar("T")


BULK_ACTIONS = ("cancel", "retry")
"""What ``POST api/runs/bulk/<action>`` does."""

API_CALLER = Operator("api")
"""Who acts through the API when the adapter knows nobody."""


def request_operator(user: str | None, address: str | None) -> Operator:
    """The operator of a request: its user (``"api"`` when unknown) and the
    client's address."""
    return Operator(user or API_CALLER.actor, address or None)


class ApiError(Exception):
    """A 4xx answer with a JSON body ``{"error": code, "message": message}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Answer:
    """What the API answers: an HTTP status, a JSON-able body and headers."""

    status: int
    body: Any
    headers: tuple[tuple[str, str], ...] = field(default=NO_STORE)


def error_answer(exc: BaseException) -> Answer | None:
    """The answer for an :class:`ApiError` or a refusal of the library
    (:data:`ERRORS`); None for anything else (a bug: the framework's 500)."""
    if isinstance(exc, ApiError):
        return failure(exc.status, exc.code, exc.message)
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            status, code = ERRORS[cls]
            if isinstance(exc, IdempotencyKeyReusedError):
                return failure(status, code, str(exc), run_id=exc.run_id)
            if isinstance(exc, StoreUnavailableError):
                answer = failure(status, code, str(exc))
                retry = ("Retry-After", str(RETRY_AFTER_SECONDS))
                return Answer(answer.status, answer.body, (*answer.headers, retry))
            return failure(status, code, str(exc))
    return None


def failure(status: int, code: str, message: str, **extra: Any) -> Answer:
    """An error answer in the one shape every error has."""
    return Answer(status, {"error": code, "message": message, **extra})


def too_large(limit: int, length: int | None = None) -> ApiError:
    """The 413 for a body over ``limit`` bytes (of ``length``, when declared)."""
    size = "larger than" if length is None else f"{length} bytes, above"
    return ApiError(413, "payload_too_large", f"the request body is {size} the limit of {limit}")


@dataclass(frozen=True)
class Body:
    """A request's body, not yet read: what the request declares, and a reader.

    ``read(n)`` returns at most ``n`` bytes (fewer at the end); the API never
    asks for more than the limit plus one byte.
    """

    content_length: int | None
    content_type: str | None  # the mimetype, without parameters
    read: Callable[[int], bytes]

    @classmethod
    def empty(cls) -> Body:
        """No body at all (a GET)."""
        return cls(0, None, lambda n: b"")


def check_length(body: Body, limit: int) -> None:
    """Refuse a body by its declared length, before a byte is read."""
    if body.content_length is not None and body.content_length > limit:
        raise too_large(limit, body.content_length)


def read_json(body: Body, limit: int) -> Any:
    """The body as JSON (None when empty), read at most one byte past ``limit``.

    It must be declared ``application/json`` (or ``+json``), even when empty.
    """
    mimetype = (body.content_type or "").lower()
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ApiError(
            415,
            "unsupported_media_type",
            "send the request with Content-Type: application/json ({} for no arguments; "
            f"got {body.content_type or 'no content type'})",
        )
    raw = body.read(limit + 1)
    if len(raw) > limit:
        raise too_large(limit)
    if not raw.strip():
        return None
    try:
        return parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None


class RunApi:
    """Every route of the run page over one Pikku, behind ``permission``.

    ``max_body_bytes`` is the largest request body taken (413 past it); by
    default the engine's ``max_input_bytes`` plus :data:`ENVELOPE_BYTES`.
    Each method returns an :class:`Answer`; only a bug raises.
    """

    def __init__(
        self,
        engine: WorkflowEngine,
        permission: Permission,
        *,
        max_body_bytes: int | None = None,
    ) -> None:
        if max_body_bytes is not None and max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must be 0 or more, not {max_body_bytes}")
        self.engine = engine
        self.permission = permission
        self.max_body_bytes = (
            engine.max_input_bytes + ENVELOPE_BYTES if max_body_bytes is None else max_body_bytes
        )

    # --- reads ---------------------------------------------------------------
    def runs(self, query: Mapping[str, str]) -> Answer:
        """A page of runs with counts per status (``permission("list", "runs")``)."""
        return self._answer(lambda: self._runs(query))

    def _runs(self, query: Mapping[str, str]) -> Answer:
        self._allow("list", LIST_TARGET)
        store = self.engine.store
        try:
            asked = self.read(lambda: parse_run_query(query, store.now_ms), "listing runs")
        except QueryError as exc:
            raise ApiError(400, "invalid_query", str(exc)) from None
        page = self.read(
            lambda: reads.list_runs(
                store, asked.filters, limit=asked.limit, offset=asked.offset, before=asked.before
            ),
            "listing runs",
        )
        return Answer(200, page)

    def run(self, run_id: str, query: Mapping[str, str] | None = None) -> Answer:
        """The run with a page of its steps (``steps_after``, ``steps_limit`` in
        ``query``: :func:`~.query.parse_steps_query`), and ``actions``: which of
        cancel, retry and signal this request may do to it now
        (``permission("status", run_id)``)."""
        return self._answer(lambda: self._run(run_id, query or {}))

    def _run(self, raw_id: str, query: Mapping[str, str]) -> Answer:
        self._allow("status", raw_id)
        rid = _run_id(raw_id)
        try:
            page = parse_steps_query(query)
        except QueryError as exc:
            raise ApiError(400, "invalid_query", str(exc)) from None
        shown = self.read(
            lambda: reads.show_run(
                self.engine.store, rid, steps_after=page.after, steps_limit=page.limit
            ),
            f"reading run {rid}",
        )
        permitted = allowed_actions(self.permission, raw_id)
        status = RunStatus(shown["run"]["status"])
        possible = {
            "cancel": not status.terminal and not shown["run"]["cancel_requested"],
            "retry": status == RunStatus.FAILED,
            "signal": not status.terminal,
        }
        shown["retention"] = describe_retention(self.engine.retention)
        shown["permissions"] = permitted
        shown["actions"] = {a: permitted[a] and possible[a] for a in permitted}
        return Answer(200, shown)

    # --- actions -------------------------------------------------------------
    # Each is kept in the run's audit trail as done by ``operator`` (the
    # adapter's: the request's user where known, else "api", and the
    # client's address).
    def cancel(self, run_id: str, body: Body, operator: Operator = API_CALLER) -> Answer:
        """Ask the run (and its children) to end as cancelled: 202; settled: 409."""
        return self._act("cancel", run_id, body, lambda rid: self.engine.cancel(rid, by=operator))

    def retry(self, run_id: str, body: Body, operator: Operator = API_CALLER) -> Answer:
        """Resume a failed run from its failed steps: 202; not failed: 409."""
        return self._act("retry", run_id, body, lambda rid: self.engine.retry(rid, by=operator))

    def signal(self, run_id: str, name: str, body: Body, operator: Operator = API_CALLER) -> Answer:
        """Deliver signal ``name`` with the body as its payload (empty: null): 202."""

        def send() -> Answer:
            check_length(body, self.max_body_bytes)
            self._allow("signal", run_id)
            rid = _run_id(run_id)
            payload = read_json(body, self.max_body_bytes)
            sent = self.engine.send_signal(rid, name, payload, by=operator)
            return self._accepted("signal", sent)

        return self._answer(send)

    def bulk(self, action: str, body: Body, operator: Operator = API_CALLER) -> Answer:
        """Cancel or retry every run a filter picks (see :mod:`.bulk`).

        Asks ``permission(action, "runs")`` first (403), then for each run
        ``permission(action, run_id)``: a run it refuses is listed in
        ``refused``, untouched. Each run acted on is audited as a single
        action. 202 (200 for ``dry_run``, which changes nothing).
        """

        def run() -> Answer:
            check_length(body, self.max_body_bytes)
            if action not in BULK_ACTIONS:
                raise ApiError(404, "not_found", f"no bulk action {action!r}: cancel or retry")
            self._allow(action, LIST_TARGET)
            store = self.engine.store
            try:
                asked = parse_bulk(read_json(body, self.max_body_bytes) or {}, store.now_ms)
            except QueryError as exc:
                raise ApiError(400, "invalid_body", str(exc)) from None
            what = BulkAction(action)
            try:
                picked = self.read(
                    lambda: pick_runs(self.engine, what, asked.runs, asked.limit + 1),
                    "picking runs",
                )
            except ValueError as exc:
                raise ApiError(400, "invalid_body", str(exc)) from None
            done = act_on_runs(
                self.engine,
                what,
                picked[: asked.limit],
                operator,
                dry_run=asked.dry_run,
                allowed=lambda rid: bool(self.permission(action, rid)),
            )
            return Answer(200 if asked.dry_run else 202, bulk_body(done, len(picked) > asked.limit))

        return self._answer(run)

    def _act(self, action: str, raw_id: str, body: Body, act: Callable[[str], RunState]) -> Answer:
        def run() -> Answer:
            check_length(body, self.max_body_bytes)
            self._allow(action, raw_id)
            rid = _run_id(raw_id)
            arguments = read_json(body, self.max_body_bytes)
            if arguments not in (None, {}):
                raise ApiError(
                    400, "invalid_body", f"{action} takes no arguments: send {{}} as the body"
                )
            return self._accepted(action, act(rid))

        return self._answer(run)

    def _accepted(self, action: str, run: RunState) -> Answer:
        now = self.read(self.engine.store.now_ms, "reading the store's clock")
        return Answer(202, {"action": action, "run": run_detail(run, now)})

    # --- shared --------------------------------------------------------------
    def read(self, read: Callable[[], T], what: str) -> T:
        """``read()`` of the store, riding out an outage for the engine's
        ``outage_timeout``, then :class:`StoreUnavailableError` (a 503)."""
        return ride_out(self.engine, read, what)

    def refusal(self, action: str, target: str) -> Answer | None:
        """The 403 answer if ``permission`` refuses ``action`` on ``target``, else None
        (for routes whose answer is not JSON, such as ``/metrics``)."""
        try:
            self._allow(action, target)
        except ApiError as exc:
            return error_answer(exc)
        return None

    def _allow(self, action: str, target: str) -> None:
        allow(self.permission, action, target)

    @staticmethod
    def _answer(work: Callable[[], Answer]) -> Answer:
        return answered(work)


def allow(permission: Permission, action: str, target: str) -> None:
    """Ask the hook first: a 403 before anything is read or looked up."""
    if not permission(action, target):
        raise ApiError(403, "forbidden", f"not allowed to {action} {target!r}")


def answered(work: Callable[[], Answer]) -> Answer:
    """``work()``'s answer, or the answer of the refusal it raised; a bug raises."""
    try:
        return work()
    except Exception as exc:
        answer = error_answer(exc)
        if answer is None:
            raise
        return answer


def _run_id(raw: str) -> str:
    """The run id in its canonical spelling, or a 400 before any lookup."""
    try:
        return check_id(raw, "run id")
    except InvalidIdError as exc:
        raise ApiError(400, "invalid_run_id", str(exc)) from None
