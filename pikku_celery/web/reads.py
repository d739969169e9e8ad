"""The two reads a person makes of the store: a page of runs, and one run whole.

Plain functions of a :class:`~pikku_celery.store.base.WorkflowStore`, so the
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
from ..engine.handle import StepHistory
from ..errors import RunNotFoundError
from ..store.base import WorkflowStore
from ..store.model import AttemptState, AuditAction, RunState, RunStatus
from .shapes import (
    audit_json,
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
) -> dict[str, Any]:
    """A page of runs, newest first, and how many of each status match.

    ``counts`` adds ``{"counts": {status: n, ..., "total": n}}`` over the
    filters but the status (what a status filter would leave), one grouped
    query. ``has_more`` says whether a next page exists (``next_offset``).
    Each live run says what it waits for (``waiting``: a signal, a timer),
    read from the page's live runs' steps in one query.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be from 1 to {MAX_LIMIT}, not {limit}")
    if offset < 0:
        raise ValueError(f"offset must be 0 or more, not {offset}")
    now = store.now_ms()
    per_status: dict[RunStatus, int] | None = None
    if filters.search is not None:
        found = _search(store, filters)
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
        )
        if counts:
            per_status = store.count_runs_by_status(
                workflow=filters.workflow, since=filters.since, until=filters.until
            )
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
        "runs": [run_summary(r, now, live.get(r.id, [])) for r in shown],
    }
    if per_status is not None:
        page["counts"] = {
            **{s.value: n for s, n in per_status.items()},
            "total": sum(per_status.values()),
        }
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


def run_history(store: WorkflowStore, run_id: str) -> tuple[RunState, list[StepHistory]]:
    """The run and its steps with their attempts, from ``store`` alone.

    As :meth:`RunHandle.steps <pikku_celery.engine.handle.RunHandle.steps>`
    reads them, without an engine. Raises :class:`RunNotFoundError`.
    """
    run = store.get_run(run_id)
    if run is None:
        raise RunNotFoundError(f"no workflow run {run_id!r}")
    attempts: dict[str, list[AttemptState]] = {}
    for attempt in store.get_attempts(run_id):
        attempts.setdefault(attempt.step_id, []).append(attempt)
    steps = [
        StepHistory(s, sorted(attempts.get(s.id, []), key=lambda a: a.attempt))
        for s in store.get_steps(run_id)
    ]
    return run, steps


def show_run(store: WorkflowStore, run_id: str) -> dict[str, Any]:
    """One run whole: the run, its steps with every attempt, its signals,
    timers and children. Raises :class:`RunNotFoundError`."""
    run, history = run_history(store, run_id)
    now = store.now_ms()
    steps = [h.step for h in history]
    audit = store.audit_trail(run.id)
    retried = [e.at for e in audit if e.action == AuditAction.RETRY]
    shown = {
        "now": iso(now),
        "run": run_detail(run, now),
        "steps": [step_json(h, now, retried) for h in history],
        "signals": signals_json(store.get_signals(run.id), steps),
        "timers": timers_json(steps, now),
        "waiting": waiting_json(run, steps),
        "audit": [audit_json(e) for e in audit],
        "children": [s.child_run_id for s in steps if s.child_run_id is not None],
    }
    if run.workflow == CANVAS_WORKFLOW:  # a durable canvas: its nodes, as a tree
        shown["canvas"] = canvas_rows(run.input)
    return shown
