"""pikku's own messages, read as untrusted input.

Anyone who can publish to the broker can send ``pikku.run_step`` or
``pikku.orchestrate`` with any arguments. Each is unpacked here by shape and
type before the engine sees it (which then checks ids are UUIDs), so a
malformed message is refused with one clear log line, never a traceback and
never a write.
"""

from __future__ import annotations

from typing import Any

from ..errors import PikkuError
from ..model.values import Delivery

STEP_FIELDS = ("run_id", "step_id", "attempt", "task_name", "queue")
TRACE_HEADER = "pikku_trace"
"""The message header holding the trace context of the message's run (a
carrier: text keys and values). Its own name, so it never meets the
``traceparent`` header a Celery instrumentation writes for its own spans."""
MAX_TRACE_FIELDS = 8
MAX_TRACE_TEXT = 1024
ORCHESTRATE_FIELDS = ("run_id", "reason")


class InvalidMessageError(PikkuError, ValueError):
    """A pikku message whose arguments do not have the shape pikku sends."""


def _bind(
    args: tuple[Any, ...], kwargs: dict[str, Any], fields: tuple[str, ...], required: int
) -> dict[str, Any]:
    if len(args) > len(fields):
        raise InvalidMessageError(f"{len(args)} arguments, at most {len(fields)} expected")
    bound = dict(zip(fields, args, strict=False))
    for key, value in kwargs.items():
        if key not in fields or key in bound:
            raise InvalidMessageError(f"unexpected or repeated argument {key!r}")
        bound[key] = value
    missing = [f for f in fields[:required] if f not in bound]
    if missing:
        raise InvalidMessageError(f"missing argument(s) {', '.join(missing)}")
    return bound


def _text(value: Any, field: str, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise InvalidMessageError(f"{field} must be a str, got {type(value).__name__}")
    return value


def step_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str, str, str | None]:
    """``(run_id, step_id, task_name, queue)`` of a ``pikku.run_step`` message.

    The attempt it carries is a hint for people reading the broker; the
    claim reads the current attempt from the database.
    """
    bound = _bind(args, kwargs, STEP_FIELDS, required=4)
    attempt = bound["attempt"]
    if not isinstance(attempt, int) or isinstance(attempt, bool):
        raise InvalidMessageError(f"attempt must be an int, got {type(attempt).__name__}")
    return (
        _text(bound["run_id"], "run_id"),
        _text(bound["step_id"], "step_id"),
        _text(bound["task_name"], "task_name"),
        _text(bound.get("queue"), "queue", optional=True),
    )


def orchestrate_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str]:
    """``(run_id, reason)`` of a ``pikku.orchestrate`` message."""
    bound = _bind(args, kwargs, ORCHESTRATE_FIELDS, required=1)
    return _text(bound["run_id"], "run_id"), _text(bound.get("reason", ""), "reason")


MAX_DELIVERY_NAME = 255
"""The longest task id or node name an attempt row keeps (its column's length)."""


def message_delivery(request: Any) -> Delivery:
    """The Celery task id of a step message and the node name of the worker
    that received it (``celery@host``), for the attempt rows it runs. A
    request made by ``Task.apply`` (``task_always_eager``) has no worker
    behind it: no node (the engine then names its ``host:pid``)."""
    task_id = getattr(request, "id", None)
    node = None if getattr(request, "is_eager", False) else getattr(request, "hostname", None)
    return Delivery(
        task_id[:MAX_DELIVERY_NAME] if isinstance(task_id, str) and task_id else None,
        node[:MAX_DELIVERY_NAME] if isinstance(node, str) and node else None,
    )


def message_trace(request: Any) -> dict[str, str] | None:
    """The trace context a pikku message carried, or None when it carried none
    or a malformed one (a header is anyone's input: ignored, never an error).

    A worker's request has the message's headers as attributes; a request
    made by ``Task.apply`` (``task_always_eager``) keeps them in ``headers``.
    """
    found = getattr(request, TRACE_HEADER, None)
    if found is None:
        headers = getattr(request, "headers", None)
        found = headers.get(TRACE_HEADER) if isinstance(headers, dict) else None
    if not isinstance(found, dict) or not 0 < len(found) <= MAX_TRACE_FIELDS:
        return None
    for key, value in found.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            return None
        if len(key) > MAX_TRACE_TEXT or len(value) > MAX_TRACE_TEXT:
            return None
    return dict(found)
