"""``pikku-celery runs list | show | cancel | retry | check-deploy``: look at runs and steer them.

Everything reads the store the app's Pikku was built on, or the one at
``--database-url``; "now" is the store's clock, so a lease's remaining time is
the one the database judges. ``list`` and ``show`` need only the store;
``cancel`` and ``retry`` also send the run's wake-up through the app's Celery
app, so with ``--database-url`` they still need ``-A``; ``check-deploy``
needs ``-A`` for the code it checks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import click
from rich.console import Group

from ..canvas.names import WORKFLOW as CANVAS_WORKFLOW
from ..model.cursor import RunCursor
from ..model.values import RunStatus, StepKind, StepStatus
from ..store.events import events_of
from ..web import reads
from ..web.reads import MAX_LIMIT, MAX_STEPS_LIMIT, RunFilter
from . import render
from .canvas_tree import canvas_tree
from .common import (
    RUN_ID,
    cli_operator,
    database_url_option,
    echo_json,
    friendly_errors,
    json_option,
    state,
)
from .events import events_table
from .params import CursorType, Since, SinceType

STEPS_SHOWN = 200
"""Steps ``runs show`` prints unless told (``--steps``)."""

ARGUMENTS_SHOWN = 80
"""Characters of a step's arguments (or an action's details) ``runs show``
prints before cutting them short (``--full``: whole)."""


@click.group()
def runs() -> None:
    """List, inspect, cancel and retry workflow runs."""


@runs.command("list")
@click.option(
    "--status",
    type=click.Choice([s.value for s in RunStatus]),
    help="Only runs with this status.",
)
@click.option("--workflow", metavar="NAME", help="Only runs of this workflow (registered name).")
@click.option(
    "--since",
    type=SinceType(),
    help="Only runs created since then: an ISO datetime (UTC unless it has an offset) "
    "or an age: 90s, 30m, 1h, 2d, 1w.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_LIMIT),
    default=20,
    show_default=True,
    help="Runs per page.",
)
@click.option(
    "--page", type=click.IntRange(min=1), default=1, show_default=True, help="Page, from 1."
)
@click.option(
    "--before",
    type=CursorType(),
    help="Only runs older than this cursor (the one a page ends with): a deep page "
    "costs what the first does, unlike --page.",
)
@database_url_option
@json_option
@friendly_errors
def list_runs(
    status: str | None,
    workflow: str | None,
    since: Since | None,
    limit: int,
    page: int,
    before: RunCursor | None,
    as_json: bool,
) -> None:
    """List runs, newest first, a page at a time."""
    store = state().store()
    now = store.now_ms()
    filters = RunFilter(
        status=RunStatus(status) if status else None,
        workflow=workflow,
        since=since.resolve(now) if since else None,
    )
    if as_json:  # the run page's listing, with the page number beside it
        listing = reads.list_runs(
            store, filters, limit=limit, offset=(page - 1) * limit, counts=False, before=before
        )
        echo_json({"page": page, **listing})
        return
    found = store.list_runs(
        status=filters.status,
        workflow=filters.workflow,
        since=filters.since,
        limit=limit + 1,  # one more tells whether a next page exists
        offset=(page - 1) * limit,
        before=before,
    )
    has_more, shown = len(found) > limit, found[:limit]
    out = render.console()
    if not shown:
        out.print("no runs match" + (f" on page {page}" if page > 1 else ""))
        return
    live = store.steps_of_runs([r.id for r in shown if not r.status.terminal])
    title = f"runs older than {before}" if before else f"runs, newest first (page {page})"
    out.print(render.runs_table(shown, now, title, live))
    if has_more:
        cursor = f"--before {RunCursor.after(shown[-1])}"
        if before is None:  # the page number, or the cursor that costs the same at any depth
            out.print(f"more on page {page + 1}: add --page {page + 1} (or {cursor})")
        else:
            out.print(f"more: add {cursor}")


@runs.command("show")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option("--full", is_flag=True, help="Show step arguments and action details whole, not cut.")
@click.option(
    "--steps",
    "steps_shown",
    type=click.IntRange(1, MAX_STEPS_LIMIT),
    default=STEPS_SHOWN,
    show_default=True,
    metavar="N",
    help="Show at most N steps (and their attempts); says how many more there are.",
)
@click.option(
    "--steps-after",
    type=click.IntRange(0),
    metavar="SEQ",
    help="Start the steps after this one (the # of the last step shown).",
)
@database_url_option
@json_option
@friendly_errors
def show_run(
    run_id: str, full: bool, steps_shown: int, steps_after: int | None, as_json: bool
) -> None:
    """Show a run, its steps, every attempt and what operators did to it.

    Each step with its attempt, worker, duration and the lease left on the
    store's clock; the task steps' arguments (cut short unless --full); each
    attempt with Celery's node name, the task id of the message that carried
    it, its duration and error; then the operator actions (cancel, retry,
    signal: when, who, from where), a retry keeping the error it cleared;
    and the progress events it set (ctx.set_event). A long history shows
    --steps of its steps, and how to see the next ones.
    """
    store = state().store()
    if as_json:  # what the run page shows of it
        echo_json(reads.show_run(store, run_id, steps_after=steps_after, steps_limit=steps_shown))
        return
    found = reads.history_page(store, run_id, steps_after, steps_shown)
    run, steps = found.run, found.shown
    now = store.now_ms()
    parts: list[Any] = [render.run_panel(run, now)]
    from .prune import retention_note

    parts.extend(filter(None, [retention_note()]))
    if run.workflow == CANVAS_WORKFLOW:
        parts.extend(filter(None, [canvas_tree(run, steps)]))
    if steps:
        parts.append(render.steps_table(steps, now))
    else:
        parts.append("no steps recorded yet" if not found.steps else "no steps after that one")
    if found.next_after is not None:
        parts.append(
            f"{found.remaining:,} more step(s) not shown: add --steps-after {found.next_after}"
        )
    limit = None if full else ARGUMENTS_SHOWN
    arguments = render.arguments_table(steps, limit)
    if arguments is not None:
        parts.append(arguments)
    if any(h.attempts for h in steps):
        parts.append(render.attempts_table(steps, now))
    events = events_of(store.event_steps(run.id))
    if events:
        parts.append(events_table(events, limit))
    audit = store.audit_trail(run.id)
    if audit:
        parts.append(render.audit_table(audit, limit))
    render.console().print(Group(*parts))


def bulk_options(fn: Any) -> Any:
    """``--workflow``, ``--status``, ``--since`` and ``--dry-run``: the filter
    of a bulk cancel or retry (given instead of a RUN)."""
    fn = click.option(
        "--dry-run", is_flag=True, help="With a filter: list the runs it picks, change nothing."
    )(fn)
    fn = click.option(
        "--jobs",
        type=click.IntRange(1, 64),
        default=4,
        show_default=True,
        help="With a filter: runs acted on at once (each is its own transaction).",
    )(fn)
    fn = click.option(
        "--since",
        type=SinceType(),
        help="With no RUN: runs created since then (ISO datetime or an age: 30m, 1h, 2d).",
    )(fn)
    fn = click.option(
        "--status",
        type=click.Choice([s.value for s in RunStatus]),
        help="With no RUN: only runs with this status.",
    )(fn)
    return click.option(
        "--workflow", metavar="NAME", help="With no RUN: only runs of this workflow."
    )(fn)


@runs.command("cancel")
@click.argument("run_id", metavar="[RUN]", type=RUN_ID, required=False)
@bulk_options
@database_url_option
@json_option
@friendly_errors
def cancel_run(
    run_id: str | None,
    workflow: str | None,
    status: str | None,
    since: Since | None,
    dry_run: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """Cancel a run and its children, or every live run a filter picks.

    The request is recorded at once; the run's next orchestration pass ends
    it. That pass is started by a message sent through your Celery app: -A
    is needed even with --database-url. Instead of RUN, --workflow, --status
    and --since pick runs in bulk (a progress bar on stderr; --dry-run only
    lists them); each run is audited as a single cancel is.
    """
    if run_id is None:
        bulk("cancel", workflow, status, since, dry_run, jobs, as_json)
        return
    _single_only(workflow, status, since, dry_run)
    pikku = state().workflows(
        "the run's next pass, which ends it, is started by a message sent through your Celery app"
    )
    run = pikku.cancel(run_id, by=cli_operator())
    if as_json:
        echo_json(render.run_summary(run, pikku.store.now_ms()))
        return
    click.echo(
        f"cancel requested for run {run.id} ({run.workflow}): "
        "its next orchestration pass ends it as cancelled"
    )


def _single_only(workflow: str | None, status: str | None, since: Since | None, dry: bool) -> None:
    if workflow or status or since or dry:
        raise click.UsageError(
            "give either a RUN or a filter (--workflow, --status, --since), not both"
        )


def bulk(
    action: str,
    workflow: str | None,
    status: str | None,
    since: Since | None,
    dry_run: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """A bulk cancel or retry from the command line's filter (see :mod:`.bulk`)."""
    from .bulk import run_bulk

    if not (workflow or status or since):
        raise click.UsageError(
            f"{action} needs a RUN, or a filter: --workflow, --status and/or --since"
        )
    status_of = RunStatus(status) if status else None
    run_bulk(action, workflow, status_of, since, dry_run, jobs, as_json)


@runs.command("retry")
@click.argument("run_id", metavar="[RUN]", type=RUN_ID, required=False)
@bulk_options
@database_url_option
@json_option
@friendly_errors
def retry_run(
    run_id: str | None,
    workflow: str | None,
    status: str | None,
    since: Since | None,
    dry_run: bool,
    jobs: int,
    as_json: bool,
) -> None:
    """Resume a failed run from its failed steps, or every failed run a filter picks.

    Each failed step gets fresh attempts (as many as it had); the steps that
    succeeded keep their results. The run is woken through your Celery app:
    -A is needed even with --database-url. Instead of RUN, --workflow and
    --since (--status can only be failed) pick failed runs in bulk (a
    progress bar on stderr; --dry-run only lists them); each run is audited
    as a single retry is.
    """
    if run_id is None:
        bulk("retry", workflow, status, since, dry_run, jobs, as_json)
        return
    _single_only(workflow, status, since, dry_run)
    pikku = state().workflows(
        "the retried steps are started by a message sent through your Celery app"
    )
    run = pikku.retry(run_id, by=cli_operator())
    reopened = [
        s
        for s in pikku.store.get_steps(run.id)
        if s.kind == StepKind.TASK and s.status == StepStatus.FAILED and s.wake_at is not None
    ]
    if as_json:
        summary = render.run_summary(run, pikku.store.now_ms())
        summary["retried_steps"] = [
            {"name": s.name, "next_attempt": s.attempt + 1, "max_attempts": s.max_attempts}
            for s in reopened
        ]
        echo_json(summary)
        return
    steps = ", ".join(f"{s.name!r} from attempt {s.attempt + 1}" for s in reopened)
    click.echo(f"run {run.id} ({run.workflow}) is {run.status.value} again: {_or_none(steps)}")


@runs.command("check-deploy")
@click.option(
    "--workflow",
    "workflows",
    metavar="NAME",
    multiple=True,
    help="Only runs of this workflow (registered name); repeat for several.",
)
@database_url_option
@json_option
@friendly_errors
def check_deploy_command(workflows: tuple[str, ...], as_json: bool) -> None:
    """Replay every run in flight on the code on disk; list those that would fail.

    Run it before a deploy (by hand or in CI) with -A naming the code you are
    about to deploy and --database-url the database its workers will use.
    Each run is replayed on the body a worker with this code would pick, over
    its recorded history; nothing is written. Listed: runs whose replay
    diverges (the step recorded there and the step this code reaches), runs
    no body here may replay (a pinned version not registered: they would
    stay blocked) and runs whose body raises. Exit code 1 if any. Runs of a
    workflow name the app does not register at all (after importing the
    modules Celery imports for it) are an error of their own, naming the
    workflows and where they were looked for: exit code 2.
    """
    from ..engine.deploy_check import check_deploy

    pikku = state().workflows("the check replays runs on your app's workflows")
    report = check_deploy(pikku, workflows=set(workflows) if workflows else None)
    if report.unknown:
        raise UnknownWorkflowsError(report.unknown, report.looked)
    if as_json:
        echo_json(render.deploy_check_json(report))
    else:
        render.console().print(render.deploy_check_tables(report))
    if not report.ok:
        click.get_current_context().exit(1)


class UnknownWorkflowsError(click.ClickException):
    """Runs in flight name workflows the app does not have: the check cannot
    judge them (the app is not the one their workers run, or a module of it
    is not imported), so it says so rather than calling them blocked."""

    exit_code = 2

    def __init__(self, unknown: Counter[str], looked: str | None) -> None:
        names = ", ".join(f"{name!r} ({n} run(s))" for name, n in sorted(unknown.items()))
        where = looked or "the modules imported with -A"
        super().__init__(
            f"runs in flight name workflow(s) this app does not register: {names}; looked in "
            f"{where}. Point -A at the app its workers run, or import the module defining "
            "them from one Celery imports (include=, imports, autodiscover_tasks)"
        )


def _or_none(steps: str) -> str:
    return f"retrying {steps}" if steps else "no failed task step to retry; replaying the body"
