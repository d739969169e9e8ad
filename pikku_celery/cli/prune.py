"""``pikku-celery runs prune``: delete settled run trees older than an age, by hand.

The same batches as the beat's prune (``Pikku(retention=...)``): whole run
trees, each batch its own short transaction, rows a worker holds skipped.
A progress bar on stderr counts the roots looked at against those matching
when it started; ``--dry-run`` counts what would go and deletes nothing.
"""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..engine.prune import DEFAULT_BATCH_SIZE, PruneReport, describe_retention, prune_runs
from ..model.values import RunStatus
from ..store.prune import PruneBatch, PruneQuery, RunPruning
from .common import ParamTypeBase, database_url_option, echo_json, friendly_errors, json_option
from .common import state as cli_state
from .params import AGE, AGE_MS

SETTLED = [s.value for s in RunStatus if s.terminal]


class AgeType(ParamTypeBase):
    """An age: ``90s``, ``30m``, ``12h``, ``30d``, ``2w`` (as milliseconds)."""

    name = "AGE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Milliseconds, or a usage error showing the forms an age takes."""
        if isinstance(value, int):
            return value
        match = AGE.match(str(value))
        if not match:
            self.fail(f"{value!r} is not an age (90s, 30m, 12h, 30d, 2w)", param, ctx)
        return round(float(match.group(1)) * AGE_MS[match.group(2).lower()])


@click.command("prune")
@click.option(
    "--older-than",
    "older_ms",
    type=AgeType(),
    required=True,
    help="Prune run trees settled longer ago than this: 12h, 30d, 2w.",
)
@click.option("--workflow", metavar="NAME", help="Only trees whose root runs this workflow.")
@click.option(
    "--status", type=click.Choice(SETTLED), help="Only trees whose root ended with this status."
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    default=DEFAULT_BATCH_SIZE,
    show_default=True,
    help="Run trees per batch; each batch is one short transaction.",
)
@database_url_option
@json_option
@friendly_errors
def prune_command(
    older_ms: int,
    workflow: str | None,
    status: str | None,
    dry_run: bool,
    batch_size: int,
    as_json: bool,
) -> None:
    """Delete settled runs older than --older-than, whole trees at a time.

    A tree is a run started by start() and every child run under it; it goes
    only when every run in it has settled (completed, failed, cancelled)
    longer ago than --older-than, with its steps, attempts, signals, audit
    rows and run leases. A run still going, and any tree it belongs to, is
    never touched; rows a worker holds right now are skipped (the next prune
    takes them). Interrupting it is safe: each batch commits whole.
    """
    store = cli_state().store()
    if not isinstance(store, RunPruning):
        raise click.ClickException(f"the store {type(store).__name__} cannot prune runs")
    query = PruneQuery(
        cutoff_ms=store.now_ms() - older_ms,
        workflow=workflow,
        status=RunStatus(status) if status else None,
        batch_size=batch_size,
    )
    total = store.count_prunable(query)
    progress = Progress(
        TextColumn("dry run" if dry_run else "pruning"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("run trees looked at"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=as_json,
    )
    with progress:
        bar = progress.add_task("prune", total=total)

        def advance(batch: PruneBatch) -> None:
            progress.update(bar, advance=batch.looked_at)

        report = prune_runs(store, query, dry_run=dry_run, on_batch=advance)
    if as_json:
        echo_json(report.as_dict())
        return
    click.echo(summary(report))


def summary(report: PruneReport) -> str:
    """One line saying what went (or would go) and the longest batch."""
    c = report.counts
    verb = "would prune" if report.dry_run else "pruned"
    return (
        f"{verb} {c.runs} run(s) in {report.trees} tree(s): {c.steps} step(s), "
        f"{c.attempts} attempt(s), {c.signals} signal(s), {c.audit} audit row(s), "
        f"{c.leases} lease(s); {report.batches} batch(es), longest "
        f"{report.max_held_ms:.1f} ms, {report.seconds:.1f} s in all"
    )


def retention_note() -> str | None:
    """How long the app keeps runs (``runs show``), when the app is known."""
    current = cli_state()
    if not current.has_app:
        return None
    return describe_retention(current.engine().retention)
