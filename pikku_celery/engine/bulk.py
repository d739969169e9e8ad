"""Bulk operations: cancel or retry every run a filter picks, one run at a time.

The runs are picked first (a snapshot: runs created after the call began
are left alone), then each is acted on through the engine's own ``cancel`` /
``retry``, so each run is audited, woken and refused exactly as a single
action would be. A run that changed meanwhile (it ended, it was retried by
someone else) is reported as refused, never an error of the whole batch.

On a crash half-way the runs already acted on stay acted on (each action is
its own commit); running the same filter again picks only what is left:
a retried run is no longer failed, a cancelled one no longer running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from ..errors import PikkuError
from ..model.values import Operator, RunState, RunStatus

if TYPE_CHECKING:
    from .core import WorkflowEngine

PAGE = 500
"""Runs read per page while picking."""


class BulkAction(StrEnum):
    """What a bulk operation does to each run it picks."""

    CANCEL = "cancel"
    RETRY = "retry"

    @property
    def picks(self) -> tuple[RunStatus, ...]:
        """The statuses the action can act on (a filter's status must be one)."""
        if self == BulkAction.RETRY:
            return (RunStatus.FAILED,)
        return tuple(s for s in RunStatus if not s.terminal)


@dataclass(frozen=True)
class RunFilter:
    """Which runs: a workflow, a status, created within ``[since, until]``
    (epoch ms on the store's clock). A status the action cannot act on is
    refused; none means every status it can."""

    workflow: str | None = None
    status: RunStatus | None = None
    since: int | None = None
    until: int | None = None

    @property
    def empty(self) -> bool:
        """Whether no filter is given (refused: a bulk action names its runs)."""
        return self.workflow is None and self.status is None and self.since is None


@dataclass
class BulkResult:
    """What a bulk operation picked and did: ``done`` run ids, ``refused``
    run ids with why, and whether it was a dry run (then nothing changed and
    ``done`` lists what would have been acted on)."""

    action: BulkAction
    dry_run: bool
    picked: list[RunState] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


def pick_runs(
    engine: WorkflowEngine, action: BulkAction, runs: RunFilter, limit: int | None = None
) -> list[RunState]:
    """The runs ``action`` would act on, newest first, at most ``limit``."""
    if runs.empty:
        raise ValueError("a bulk action needs a filter: a workflow, a status or a since")
    allowed = action.picks
    if runs.status is not None and runs.status not in allowed:
        raise ValueError(
            f"{action.value} acts on runs that are {' or '.join(s.value for s in allowed)}, "
            f"not {runs.status.value}"
        )
    store = engine.store
    until = store.now_ms() if runs.until is None else runs.until  # the snapshot
    picked: dict[str, RunState] = {}
    for status in (runs.status,) if runs.status is not None else allowed:
        for run in _pages(engine, status, runs, until):
            if action == BulkAction.CANCEL and run.cancel_requested:
                continue  # asked already: its next pass ends it
            picked.setdefault(run.id, run)
            if limit is not None and len(picked) >= limit:
                break
    ordered = sorted(picked.values(), key=lambda r: r.created_at, reverse=True)
    return ordered if limit is None else ordered[:limit]


def _pages(
    engine: WorkflowEngine, status: RunStatus, runs: RunFilter, until: int
) -> Iterator[RunState]:
    offset = 0
    while True:
        page = engine.store.list_runs(
            status=status,
            workflow=runs.workflow,
            since=runs.since,
            until=until,
            limit=PAGE,
            offset=offset,
        )
        yield from page
        if len(page) < PAGE:
            return
        offset += PAGE


def act_on_runs(
    engine: WorkflowEngine,
    action: BulkAction,
    runs: list[RunState],
    by: Operator,
    *,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    allowed: Callable[[str], bool] | None = None,
    workers: int = 1,
) -> BulkResult:
    """``action`` on each of ``runs`` (nothing with ``dry_run``), each audited
    as done ``by``; ``progress(n)`` after each run; ``allowed(run_id)``
    (a permission hook) may refuse single runs. ``workers`` threads act at
    once (each run is its own transaction: a server database commits them
    side by side); ``done`` keeps the order of ``runs``."""
    if workers < 1:
        raise ValueError(f"workers must be 1 or more, not {workers}")
    result = BulkResult(action, dry_run, picked=list(runs))
    act = engine.cancel if action == BulkAction.CANCEL else engine.retry

    def one(run: RunState) -> str | None:
        """Why the run was refused, or None when done."""
        if allowed is not None and not allowed(run.id):
            why: str | None = f"not allowed to {action.value} this run"
        elif dry_run:
            why = None
        else:
            try:
                act(run.id, by=by)
                why = None
            except PikkuError as exc:  # it changed meanwhile: settled, not failed any more
                why = str(exc)
        if progress is not None:
            progress(1)
        return why

    if workers == 1 or len(runs) < 2:
        outcomes = [one(run) for run in runs]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="pikku-bulk") as pool:
            outcomes = list(pool.map(one, runs))
    for run, why in zip(runs, outcomes, strict=True):
        if why is None:
            result.done.append(run.id)
        else:
            result.refused[run.id] = why
    return result
