"""``runs cancel|retry --workflow W --status S --since T [--dry-run]``: bulk actions.

The runs are picked once on the store's clock, then acted on one by one
through the app's Pikku (each audited as the command line's own single
action), with a progress bar on stderr so ``--json`` on stdout stays clean.
Interrupted (Ctrl-C, a crash), what was done stays done: the same command
again picks only what is left.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..engine.bulk import BulkAction, BulkResult, RunFilter, act_on_runs, pick_runs
from ..model.values import RunStatus
from . import render
from .common import cli_operator, echo_json, state

if TYPE_CHECKING:
    from .params import Since

DONE = {"cancel": "cancelled", "retry": "retried"}

SHOWN = 20
"""Runs a human-readable dry run lists before saying how many more."""


def run_bulk(
    action: str,
    workflow: str | None,
    status: RunStatus | None,
    since: Since | None,
    dry_run: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """Pick the runs, act on each, ``jobs`` at once (or only list them with
    ``dry_run``), report."""
    what = BulkAction(action)
    pikku = state().workflows(
        f"each {DONE[action]} run is woken by a message sent through your Celery app"
    )
    now = pikku.store.now_ms()
    runs = RunFilter(workflow, status, since.resolve(now) if since else None, now)
    try:
        picked = pick_runs(pikku, what, runs)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if dry_run:
        result = act_on_runs(pikku, what, picked, cli_operator(), dry_run=True)
    else:
        progress = Progress(
            TextColumn(f"{action} runs"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        with progress:
            task = progress.add_task(action, total=len(picked))
            result = act_on_runs(
                pikku,
                what,
                picked,
                cli_operator(),
                progress=lambda n: progress.advance(task, n),
                workers=jobs,
            )
    report(result, as_json)


def report(result: BulkResult, as_json: bool) -> None:
    """The outcome, as JSON or for people."""
    action = result.action.value
    if as_json:
        echo_json(
            {
                "action": action,
                "dry_run": result.dry_run,
                "picked": len(result.picked),
                "done": result.done,
                "refused": result.refused,
            }
        )
        return
    out = render.console()
    if result.dry_run:
        out.print(f"dry run: {len(result.done)} run(s) would be {DONE[action]}; nothing changed")
        for run in result.picked[:SHOWN]:
            out.print(
                f"  {run.id}  {run.workflow}  {run.status.value}  {render.clock(run.created_at)}"
            )
        if len(result.picked) > SHOWN:
            out.print(f"  ... and {len(result.picked) - SHOWN} more (--json lists them all)")
        return
    out.print(f"{action}: {len(result.done)} of {len(result.picked)} run(s) done")
    for run_id, why in list(result.refused.items())[:SHOWN]:
        out.print(f"  refused {run_id}: {why}")
    if len(result.refused) > SHOWN:
        out.print(f"  ... and {len(result.refused) - SHOWN} more refused (--json lists them all)")
