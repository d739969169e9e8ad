"""``pikku-celery runs list | show | cancel | retry | check-deploy``: look at runs and steer them.

Everything reads the store the app's Pikku was built on, or the one at
``--database-url``; "now" is the store's clock, so a lease's remaining time is
the one the database judges. ``list`` and ``show`` need only the store;
``cancel`` and ``retry`` also send the run's wake-up through the app's Celery
app, so with ``--database-url`` they still need ``-A``; ``check-deploy``
needs ``-A`` for the code it checks.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Group

from ..canvas.names import WORKFLOW as CANVAS_WORKFLOW
from ..store.model import RunStatus, StepKind, StepStatus
from ..web import reads
from ..web.reads import MAX_LIMIT, RunFilter
from . import render
from .canvas_tree import canvas_tree
from .common import (
    RUN_ID,
    ParamTypeBase,
    cli_operator,
    database_url_option,
    echo_json,
    friendly_errors,
    json_option,
    state,
)

ARGUMENTS_SHOWN = 80
"""Characters of a step's arguments (or an action's details) ``runs show``
prints before cutting them short (``--full``: whole)."""

AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.IGNORECASE)
AGE_MS = {"s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
AGE_MS.update({"d": 86_400_000, "w": 604_800_000})


@dataclass(frozen=True)
class Since:
    """``--since``: an instant (epoch ms) or an age before the store's now."""

    at_ms: int | None = None
    age_ms: int | None = None

    def resolve(self, now_ms: int) -> int:
        """The instant, in epoch ms, that ``--since`` means at ``now_ms``."""
        if self.at_ms is not None:
            return self.at_ms
        assert self.age_ms is not None
        return now_ms - self.age_ms


class SinceType(ParamTypeBase):
    """An ISO datetime (UTC unless it carries an offset) or an age like ``30m``."""

    name = "WHEN"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Since:
        """Parse an age (``90s``, ``1h``, ``2d``) or an ISO 8601 instant."""
        if isinstance(value, Since):
            return value
        text = str(value)
        match = AGE.match(text)
        if match:
            amount, unit = float(match.group(1)), match.group(2).lower()
            return Since(age_ms=round(amount * AGE_MS[unit]))
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            self.fail(
                f"{text!r} is neither an ISO datetime (2024-05-01T12:00) "
                "nor an age (90s, 30m, 1h, 2d, 1w)",
                param,
                ctx,
            )
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return Since(at_ms=round(when.timestamp() * 1000))


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
@database_url_option
@json_option
@friendly_errors
def list_runs(
    status: str | None,
    workflow: str | None,
    since: Since | None,
    limit: int,
    page: int,
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
            store, filters, limit=limit, offset=(page - 1) * limit, counts=False
        )
        echo_json({"page": page, **listing})
        return
    found = store.list_runs(
        status=filters.status,
        workflow=filters.workflow,
        since=filters.since,
        limit=limit + 1,  # one more tells whether a next page exists
        offset=(page - 1) * limit,
    )
    has_more, shown = len(found) > limit, found[:limit]
    out = render.console()
    if not shown:
        out.print("no runs match" + (f" on page {page}" if page > 1 else ""))
        return
    live = store.steps_of_runs([r.id for r in shown if not r.status.terminal])
    out.print(render.runs_table(shown, now, f"runs, newest first (page {page})", live))
    if has_more:
        out.print(f"more on page {page + 1}: add --page {page + 1}")


@runs.command("show")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option("--full", is_flag=True, help="Show step arguments and action details whole, not cut.")
@database_url_option
@json_option
@friendly_errors
def show_run(run_id: str, full: bool, as_json: bool) -> None:
    """Show a run, its steps, every attempt and what operators did to it.

    Each step with its attempt, worker, duration and the lease left on the
    store's clock; the task steps' arguments (cut short unless --full); each
    attempt with Celery's node name, the task id of the message that carried
    it, its duration and error; then the operator actions (cancel, retry,
    signal: when, who, from where), a retry keeping the error it cleared.
    """
    store = state().store()
    if as_json:  # what the run page shows of it
        echo_json(reads.show_run(store, run_id))
        return
    run, steps = reads.run_history(store, run_id)
    now = store.now_ms()
    parts: list[Any] = [render.run_panel(run, now)]
    if run.workflow == CANVAS_WORKFLOW:
        parts.extend(filter(None, [canvas_tree(run, steps)]))
    if steps:
        parts.append(render.steps_table(steps, now))
    else:
        parts.append("no steps recorded yet")
    limit = None if full else ARGUMENTS_SHOWN
    arguments = render.arguments_table(steps, limit)
    if arguments is not None:
        parts.append(arguments)
    if any(h.attempts for h in steps):
        parts.append(render.attempts_table(steps, now))
    audit = store.audit_trail(run.id)
    if audit:
        parts.append(render.audit_table(audit, limit))
    render.console().print(Group(*parts))


@runs.command("cancel")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@database_url_option
@json_option
@friendly_errors
def cancel_run(run_id: str, as_json: bool) -> None:
    """Cancel a run and its children.

    The request is recorded at once; the run's next orchestration pass ends
    it. That pass is started by a message sent through your Celery app: -A
    is needed even with --database-url.
    """
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


@runs.command("retry")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@database_url_option
@json_option
@friendly_errors
def retry_run(run_id: str, as_json: bool) -> None:
    """Resume a failed run from its failed steps.

    Each failed step gets fresh attempts (as many as it had); the steps that
    succeeded keep their results. The run is woken through your Celery app:
    -A is needed even with --database-url.
    """
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
