"""The body of ``POST api/runs/bulk/<cancel|retry>``, checked, and its answer.

``{"workflow": ..., "status": ..., "since": ..., "until": ..., "limit": ...,
"dry_run": ...}``: the filter as the runs list takes it (``since``/``until``
as epoch ms, an ISO 8601 instant or an age such as ``1h``), at most
``limit`` runs a request (default :data:`DEFAULT_LIMIT`, at most
:data:`MAX_LIMIT`, newest first; ``more`` says to send it again). Unknown
keys are refused, so a typo never widens the filter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..engine.bulk import BulkResult, RunFilter
from ..model.values import RunStatus
from .query import QueryError, parse_instant

KEYS = ("workflow", "status", "since", "until", "limit", "dry_run")
"""What a bulk action's body may hold."""

DEFAULT_LIMIT = 1000
MAX_LIMIT = 10_000
"""Runs one request acts on at most: a request must end well within an HTTP
timeout; a client repeats while ``more`` is true."""


@dataclass(frozen=True)
class BulkRequest:
    """A checked bulk request: the filter, how many runs, and whether to act."""

    runs: RunFilter
    limit: int
    dry_run: bool


def parse_bulk(body: Any, now_ms: Callable[[], int]) -> BulkRequest:
    """The request from its JSON body; :class:`QueryError` names what is wrong."""
    if not isinstance(body, dict):
        raise QueryError('send a JSON object: {"workflow": ..., "status": ..., "since": ...}')
    unknown = sorted(set(body) - set(KEYS))
    if unknown:
        raise QueryError(
            f"unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}"
        )
    workflow, status = body.get("workflow"), body.get("status")
    if workflow is not None and not isinstance(workflow, str):
        raise QueryError("workflow must be a string")
    if status is not None and status not in {s.value for s in RunStatus}:
        raise QueryError(
            f"status={status!r} is not a run status; one of: "
            + ", ".join(s.value for s in RunStatus)
        )
    limit = body.get("limit", DEFAULT_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise QueryError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise QueryError("dry_run must be true or false")
    return BulkRequest(
        RunFilter(
            workflow=workflow,
            status=None if status is None else RunStatus(status),
            since=_instant(body.get("since"), "since", now_ms),
            until=_instant(body.get("until"), "until", now_ms),
        ),
        limit,
        dry_run,
    )


def _instant(value: Any, what: str, now_ms: Callable[[], int]) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise QueryError(f"{what} must be epoch ms, an ISO datetime or an age (1h)")
    return parse_instant(str(value), what, now_ms)


def bulk_body(result: BulkResult, more: bool) -> dict[str, Any]:
    """The answer's body: what was picked, done and refused."""
    return {
        "action": result.action.value,
        "dry_run": result.dry_run,
        "picked": len(result.picked),
        "done": result.done,
        "refused": result.refused,
        "more": more,
    }
