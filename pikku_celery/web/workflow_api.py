"""The Flask blueprint's own endpoints, framework-neutral: start a run, read it, signal, cancel.

:class:`WorkflowApi` answers them as :class:`~.api.RunApi` answers the run
page's routes: request values in, an :class:`~.api.Answer` out, every refusal
in the one error shape (:func:`~.api.error_answer`). The run is shown as
:func:`~.summary.run_summary` (start, status) or :func:`~.summary.run_dict`
(signal, cancel). Checks run in the blueprint's order: the permission hook
(403), then the run id (400), then the body.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..engine.core import WorkflowEngine
from ..engine.run_ids import parse_run_id
from ..model.values import Operator, RunState
from ..payload import parse_json
from .api import API_CALLER, Answer, ApiError, Body, allow, answered
from .permissions import Permission
from .summary import run_dict, run_summary

START_KEYS = frozenset({"input", "idempotency_key", "timeout"})
"""The keys a start's body may hold."""

_START_SHAPE = '{"input": ..., "idempotency_key": ...}'


def body_too_large(limit: int) -> str:
    """The 413's message for a body (of unknown length) over ``limit`` bytes."""
    return f"the request body is larger than the limit of {limit} bytes"


def read_body(body: Body, limit: int) -> Any:
    """The body as JSON; ``None`` when there is none (whatever its type).

    A body must be declared JSON: a browser form (``text/plain``,
    ``application/x-www-form-urlencoded``) is refused with 415, so a page
    elsewhere cannot start runs through a visitor's browser. The read stops
    one byte past ``limit``; a body that long is refused with 413.
    """
    raw = body.read(limit + 1)
    if len(raw) > limit:
        raise ApiError(413, "payload_too_large", body_too_large(limit))
    if not raw.strip():
        return None
    mimetype = (body.content_type or "").lower()
    if mimetype != "application/json" and not (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    ):
        raise ApiError(
            415,
            "unsupported_media_type",
            "send the body as JSON with Content-Type: application/json "
            f"(got {body.content_type or 'no content type'})",
        )
    try:
        return parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None


def start_arguments(body: Any) -> tuple[Any, str | None, float | None]:
    """A start's body checked: its input, idempotency key and timeout."""
    if body is None:
        raise ApiError(
            400,
            "bad_request",
            "the request has no body; send a JSON object with the key 'input': "
            f'{_START_SHAPE} ({{"input": null}} for no input)',
        )
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_body", f"the body must be a JSON object: {_START_SHAPE}")
    unknown = sorted(set(body) - START_KEYS)
    if unknown:
        raise ApiError(
            400,
            "invalid_body",
            f"unknown key(s) {', '.join(map(repr, unknown))}; "
            "expected 'input' and optionally 'idempotency_key' and 'timeout'",
        )
    if "input" not in body:
        raise ApiError(
            400,
            "bad_request",
            f"the body lacks the key 'input': send {_START_SHAPE} "
            '({"input": null} for no input)',
        )
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise ApiError(400, "invalid_payload", "timeout must be a number of seconds > 0 (or null)")
    return body["input"], body.get("idempotency_key"), timeout


class WorkflowApi:
    """Start, status, signal and cancel over one Pikku, behind ``permission``.

    ``location(run_id)`` is the URL of a run's status, sent as ``Location``
    with every 202. ``tracebacks`` adds failed steps' tracebacks to answers.
    Each method returns an :class:`~.api.Answer`; only a bug raises.
    """

    def __init__(
        self,
        engine: WorkflowEngine,
        permission: Permission,
        *,
        max_body_bytes: int,
        location: Callable[[str], str],
        tracebacks: bool = False,
    ) -> None:
        self.engine = engine
        self.permission = permission
        self.max_body_bytes = max_body_bytes
        self.location = location
        self.tracebacks = tracebacks

    def start(self, name: str, body: Body) -> Answer:
        """Start a run of workflow ``name``; an idempotency key already used returns its run."""

        def start() -> Answer:
            self._allow("start", name)
            given, key, timeout = start_arguments(read_body(body, self.max_body_bytes))
            handle = self.engine.start(name, given, idempotency_key=key, timeout=timeout)
            return self._accepted(handle.run_id, run_summary(handle, tracebacks=self.tracebacks))

        return answered(start)

    def status(self, run_id: str) -> Answer:
        """The run: status, output or error, and every step with its attempts."""

        def status() -> Answer:
            self._allow("status", run_id)
            handle = self.engine.handle(_run_id(run_id))
            return Answer(200, run_summary(handle, tracebacks=self.tracebacks))

        return answered(status)

    def signal(self, run_id: str, name: str, body: Body, by: Operator = API_CALLER) -> Answer:
        """Deliver signal ``name`` with the body as its payload (no body: null)."""

        def signal() -> Answer:
            self._allow("signal", run_id)
            rid = _run_id(run_id)
            payload = read_body(body, self.max_body_bytes)
            return self._run_accepted(self.engine.send_signal(rid, name, payload, by=by))

        return answered(signal)

    def cancel(self, run_id: str, by: Operator = API_CALLER) -> Answer:
        """Ask the run (and its children) to end as cancelled; a settled run is a 409."""

        def cancel() -> Answer:
            self._allow("cancel", run_id)
            return self._run_accepted(self.engine.cancel(_run_id(run_id), by=by))

        return answered(cancel)

    def _allow(self, action: str, target: str) -> None:
        allow(self.permission, action, target)

    def _run_accepted(self, run: RunState) -> Answer:
        return self._accepted(run.id, run_dict(run, tracebacks=self.tracebacks))

    def _accepted(self, run_id: str, shown: dict[str, Any]) -> Answer:
        answer = Answer(202, shown)
        return Answer(202, shown, (*answer.headers, ("Location", self.location(run_id))))


def _run_id(raw: str) -> str:
    try:
        return parse_run_id(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_run_id", str(exc)) from None
