"""The two reads a person makes of the store: a page of runs, and one run whole.

Plain functions of a :class:`~pikku_celery.ports.store.WorkflowStore`, so the
run page's API and ``pikku-celery runs list/show --json`` answer with one
implementation (the command line reads with ``--database-url`` alone, no
engine). "Now" is the store's clock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from ..canvas.names import WORKFLOW as CANVAS_WORKFLOW
from ..canvas.shape import canvas_rows
from ..engine.handle import StepHistory, read_history, with_attempts
from ..errors import RunNotFoundError
from ..model.cursor import COUNT_CAP, RunCursor
from ..model.values import AuditAction, RunState, RunStatus, StepState, StepStatus
from ..ports.store import WorkflowStore
from .shapes import (
    audit_json,
    events_json,
    iso,
    run_detail,
    run_summary,
    signals_json,
    step_json,
    timers_json,
    waiting_json,
)

MAX_LIMIT = 1000
"""The most runs one page holds (the command line's ``--limit`` bound too)."""

DEFAULT_LIMIT = 50
"""Runs per page when the request names no limit."""

STEPS_LIMIT = 500
"""Steps the run page's API shows of a run when the request names no limit."""

MAX_STEPS_LIMIT = 5000
"""The most steps one answer of the run page's API holds."""


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing shows; ``since``/``until`` bound ``created_at`` (epoch ms).

    ``search`` is a run id or an idempotency key (of any workflow): the runs
    that have it, narrowed by the other filters.
    """

    status: RunStatus | None = None
    workflow: str | None = None
    since: int | None = None
    until: int | None = None
    search: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The filter as the listing echoes it back."""
        return {
            "status": None if self.status is None else self.status.value,
            "workflow": self.workflow,
            "since": iso(self.since),
            "until": iso(self.until),
            "search": self.search,
        }

    def admits(self, run: RunState) -> bool:
        """Whether ``run`` passes the filters other than ``search``."""
        return (
            (self.status is None or run.status == self.status)
            and (self.workflow is None or run.workflow == self.workflow)
            and (self.since is None or run.created_at >= self.since)
            and (self.until is None or run.created_at < self.until)
        )


def list_runs(
    store: WorkflowStore,
    filters: RunFilter = RunFilter(),  # frozen: one default shared safely
    *,
    limit: int = DEFAULT_LIMIT,
    offset: int = 0,
    counts: bool = True,
    before: RunCursor | None = None,
) -> dict[str, Any]:
    """A page of runs, newest first, and how many of each status match.

    ``counts`` adds ``{"counts": {status: n, ..., "total": n}}`` over the
    filters but the status (what a status filter would leave), each count
    stopping at :data:`~pikku_celery.model.cursor.COUNT_CAP` (then
    ``counts_capped`` is true and such a count reads "10,000+"): a count
    never reads more of the table than that. ``has_more`` says whether a next
    page exists: ``next_cursor`` (pass it as ``before``) starts it at the
    same cost however deep it is; ``next_offset`` still works too. Each live
    run says what it waits for (``waiting``: a signal, a timer), read from
    the page's live runs' steps in one query.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, not {limit}")
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, not {offset}")
    now = store.now_ms()
    per_status: dict[RunStatus, int] | None = None
    capped = False
    if filters.search is not None:
        found = [r for r in _search(store, filters) if before is None or before.admits(r)]
        shown = [r for r in found if filters.admits(r)][offset : offset + limit + 1]
        if counts:
            any_status = replace(filters, status=None)
            per_status = dict.fromkeys(RunStatus, 0)
            for run in found:
                if any_status.admits(run):
                    per_status[run.status] += 1
    else:
        shown = store.list_runs(
            status=filters.status,
            workflow=filters.workflow,
            since=filters.since,
            until=filters.until,
            limit=limit + 1,  # one more tells whether a next page exists
            offset=offset,
            before=before,
        )
        if counts:
            per_status = store.count_runs_capped(
                cap=COUNT_CAP, workflow=filters.workflow, since=filters.since, until=filters.until
            )
            capped = any(n > COUNT_CAP for n in per_status.values())
            per_status = {s: min(n, COUNT_CAP) for s, n in per_status.items()}
    has_more = len(shown) > limit
    shown = shown[:limit]
    live = store.steps_of_runs([r.id for r in shown if not r.status.terminal])
    page: dict[str, Any] = {
        "now": iso(now),
        "filters": filters.as_json(),
        "limit": limit,
        "offset": offset,
        "has_more": has_more,
        "next_offset": offset + limit if has_more else None,
        "before": None if before is None else str(before),
        "next_cursor": str(RunCursor.after(shown[-1])) if has_more else None,
        "runs": [run_summary(r, now, live.get(r.id, [])) for r in shown],
    }
    if per_status is not None:
        page["counts"] = {
            **{s.value: n for s, n in per_status.items()},
            "total": sum(per_status.values()),
        }
        page["counts_capped"] = capped
        page["count_cap"] = COUNT_CAP
    return page


SEARCH_LIMIT = 200
"""The most runs a search by idempotency key looks at (a key names a few runs)."""


def _search(store: WorkflowStore, filters: RunFilter) -> list[RunState]:
    """The runs whose id or idempotency key is ``filters.search``, newest first."""
    text = filters.search or ""
    found = {r.id: r for r in store.runs_with_key(text, SEARCH_LIMIT)}
    try:
        run_id = str(uuid.UUID(text))
    except ValueError:
        run_id = None
    if run_id is not None and run_id not in found:
        run = store.get_run(run_id)
        if run is not None:
            found[run.id] = run
    return sorted(found.values(), key=lambda r: (r.created_at, r.id), reverse=True)


def run_history(
    store: WorkflowStore, run_id: str, after: int | None = None, limit: int | None = None
) -> tuple[RunState, list[StepHistory]]:
    """The run and its steps with their attempts, from ``store`` alone: all
    of them, or a page (as :func:`~pikku_celery.engine.handle.read_history`).

    As :meth:`RunHandle.steps <pikku_celery.engine.handle.RunHandle.steps>`
    reads them, without an engine. Raises :class:`RunNotFoundError`.
    """
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"no workflow run {run_id!r}")
    return run, read_history(store, run_id, after, limit)


@dataclass(frozen=True)
class HistoryPage:
    """A run, all its steps, and the page of them shown with their attempts."""

    run: RunState
    steps: list[StepState]  # paged: outlines (no payloads); whole: the steps
    shown: list[StepHistory]
    after: int | None  # the page starts above this seq (None: at the first step)
    limit: int | None  # None: every step from ``after`` on
    remaining: int  # steps after the page

    @property
    def next_after(self) -> int | None:
        """The ``after`` of the next page (None: the page reached the last step)."""
        return self.shown[-1].step.seq if self.remaining and self.shown else None


def history_page(
    store: WorkflowStore, run_id: str, after: int | None = None, limit: int | None = None
) -> HistoryPage:
    """The run and a page of its steps: every step's outline (what the run
    waits for, its timers, signals and counts need no payloads), the page's
    steps whole with their attempts. Raises :class:`RunNotFoundError`, and
    ``ValueError`` for a negative ``after`` or a ``limit`` below 1."""
    if after is not None and after < 0:
        raise ValueError(f"steps_after must be a step's seq (0 or more), not {after}")
    if limit is not None and limit < 1:
        raise ValueError(f"steps_limit must be 1 or more, not {limit}")
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"no workflow run {run_id!r}")
    if after is None and limit is None:
        steps = store.get_steps(run.id)
        shown = with_attempts(steps, store.get_attempts(run.id))
        return HistoryPage(run, steps, shown, after, limit, 0)
    steps = store.get_step_outlines(run.id)
    low = -1 if after is None else after
    later = sum(1 for s in steps if s.seq > low)
    page = store.get_steps_page(run.id, after, later if limit is None else limit)
    attempts = store.get_attempts_page(run.id, after, page[-1].seq) if page else []
    shown = with_attempts(page, attempts)
    return HistoryPage(run, steps, shown, after, limit, max(0, later - len(page)))


def show_run(
    store: WorkflowStore,
    run_id: str,
    *,
    steps_after: int | None = None,
    steps_limit: int | None = None,
) -> dict[str, Any]:
    """One run: the run, its steps with every attempt, its signals, timers,
    children and progress events. Raises :class:`RunNotFoundError`.

    With ``steps_limit``, ``steps`` holds at most that many steps with
    ``seq`` above ``steps_after`` (and only their attempts are read);
    ``next_steps`` is the ``steps_after`` of the next page (None: no more).
    ``steps_total`` and ``step_counts`` count the whole run either way, and
    signals, timers, children and events stay the whole run's.
    """
    found = history_page(store, run_id, steps_after, steps_limit)
    run, steps = found.run, found.steps
    now = store.now_ms()
    audit = store.audit_trail(run.id)
    retried = [e.at for e in audit if e.action == AuditAction.RETRY]
    shown = {
        "now": iso(now),
        "run": run_detail(run, now),
        "steps": [step_json(h, now, retried) for h in found.shown],
        "steps_after": steps_after,
        "steps_limit": steps_limit,
        "next_steps": found.next_after,
        "steps_total": len(steps),
        "step_counts": step_counts(steps),
        "signals": signals_json(store.get_signals(run.id), steps),
        "timers": timers_json(steps, now),
        "waiting": waiting_json(run, steps),
        "audit": [audit_json(e) for e in audit],
        "children": [s.child_run_id for s in steps if s.child_run_id is not None],
        "events": events_json(store.event_steps(run.id)),
    }
    if run.workflow == CANVAS_WORKFLOW:  # a durable canvas: its nodes, as a tree
        shown["canvas"] = canvas_rows(run.input)
    return shown


def step_counts(steps: list[StepState]) -> dict[str, int]:
    """How many of ``steps`` there are of each status (every status a key)."""
    counts = dict.fromkeys((s.value for s in StepStatus), 0)
    for step in steps:
        counts[step.status.value] += 1
    return counts
