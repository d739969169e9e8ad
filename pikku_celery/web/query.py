"""The runs list's query string, checked: filters, a page, and clear 400s.

``status``, ``workflow``, ``since`` / ``until`` (epoch milliseconds, an ISO
8601 instant, UTC unless it carries an offset, or an age before the store's
now: ``90s``, ``30m``, ``1h``, ``2d``, ``1w``), ``q`` (a run id or an
idempotency key), ``limit`` (1 to :data:`~.reads.MAX_LIMIT`), ``offset`` and
``before`` (a page's ``next_cursor``: the next page, at the cost of the first).
An unknown key is refused, so a typo never lists everything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from ..model.cursor import RunCursor
from ..model.values import RunStatus
from .reads import DEFAULT_LIMIT, MAX_LIMIT, MAX_STEPS_LIMIT, STEPS_LIMIT, RunFilter

KEYS = ("status", "workflow", "since", "until", "q", "limit", "offset", "before")
"""What the runs list's query string may hold."""

AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.IGNORECASE)
AGE_MS = {"s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
AGE_MS.update({"d": 86_400_000, "w": 604_800_000})

LATEST_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last instant a datetime (and ISO 8601) holds."""

MAX_OFFSET = 1_000_000_000
"""The furthest a page may start (beyond any real store; keeps SQL integers small)."""


class QueryError(ValueError):
    """A query string value the runs list cannot take; the message says which."""


@dataclass(frozen=True)
class RunQuery:
    """A checked runs-list request: its filters and its page."""

    filters: RunFilter
    limit: int
    offset: int
    before: RunCursor | None = None


def parse_instant(text: str, what: str, now_ms: Callable[[], int]) -> int:
    """``text`` as epoch milliseconds: digits are ms already, an ISO 8601
    instant (UTC unless it has an offset), or an age before ``now_ms()``."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return _bounded(int(text[:20]) if len(text) <= 20 else LATEST_MS + 1, what)
    match = AGE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        return _bounded(now_ms() - round(min(amount, 1e15) * AGE_MS[unit]), what)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise QueryError(
            f"{what}={text[:60]!r} is neither epoch milliseconds, an ISO datetime "
            "(2024-05-01T12:00) nor an age (90s, 30m, 1h, 2d, 1w)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded(round(when.timestamp() * 1000), what)


def _bounded(ms: int, what: str) -> int:
    if not 0 <= ms <= LATEST_MS:
        raise QueryError(f"{what} must lie between 1970 and 9999 (epoch ms 0 to {LATEST_MS})")
    return ms


def _whole(text: str, what: str, low: int, high: int) -> int:
    text = text.strip()
    if not (text.isascii() and text.isdigit()):
        raise QueryError(f"{what}={text[:60]!r} is not a whole number")
    value = int(text) if len(text) <= 20 else high + 1
    if not low <= value <= high:
        raise QueryError(f"{what} must be from {low} to {high}, not {text[:60]}")
    return value


def parse_run_query(query: Mapping[str, str], now_ms: Callable[[], int]) -> RunQuery:
    """The runs list's request from its query string (empty values count as absent).

    Raises :class:`QueryError` naming the key; ``now_ms`` (the store's clock)
    is read only for an age.
    """
    unknown = sorted(set(query) - set(KEYS))
    if unknown:
        raise QueryError(
            f"unknown query key(s) {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}"
        )
    given = {k: v for k, v in query.items() if v != ""}
    status = given.get("status")
    if status is not None and status not in {s.value for s in RunStatus}:
        raise QueryError(
            f"status={status[:60]!r} is not a run status; one of: "
            + ", ".join(s.value for s in RunStatus)
        )
    since, until = given.get("since"), given.get("until")
    filters = RunFilter(
        status=None if status is None else RunStatus(status),
        workflow=given.get("workflow"),
        since=None if since is None else parse_instant(since, "since", now_ms),
        until=None if until is None else parse_instant(until, "until", now_ms),
        search=given.get("q"),
    )
    limit = _whole(given["limit"], "limit", 1, MAX_LIMIT) if "limit" in given else DEFAULT_LIMIT
    offset = _whole(given["offset"], "offset", 0, MAX_OFFSET) if "offset" in given else 0
    before = None
    if "before" in given:
        try:
            before = RunCursor.parse(given["before"])
        except ValueError as exc:
            raise QueryError(f"before: {exc}; pass a page's next_cursor") from None
    return RunQuery(filters, limit, offset, before)


@dataclass(frozen=True)
class StepsQuery:
    """A checked run request's page of steps: after which ``seq``, how many."""

    after: int | None
    limit: int


def parse_steps_query(query: Mapping[str, str]) -> StepsQuery:
    """The page of steps a run request asks for: ``steps_after`` (a page's
    ``next_steps``) and ``steps_limit`` (1 to :data:`~.reads.MAX_STEPS_LIMIT`,
    :data:`~.reads.STEPS_LIMIT` when absent). Other keys are left alone."""
    after, limit = query.get("steps_after", ""), query.get("steps_limit", "")
    return StepsQuery(
        after=_whole(after, "steps_after", 0, MAX_OFFSET) if after != "" else None,
        limit=_whole(limit, "steps_limit", 1, MAX_STEPS_LIMIT) if limit != "" else STEPS_LIMIT,
    )
