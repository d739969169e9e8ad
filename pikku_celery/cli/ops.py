"""``signal``, ``sweep`` and ``leases``: the operator's levers beside ``runs``.

With ``--database-url``, ``signal`` and ``sweep`` still need ``-A``: what they
do is send messages through the app's Celery app. ``leases`` without ``-A``
shows what the store alone knows: the steps no worker took, by queue.
"""

from __future__ import annotations

import inspect
import json
import time
from typing import TYPE_CHECKING, Any

import click

from ..celery.queues import transport_name
from ..engine.core import WorkflowEngine
from ..payload import parse_json
from . import render
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

if TYPE_CHECKING:
    from ..celery.integration import Pikku
    from ..ports.store import WorkflowStore

# Without -A the app's message_grace is unknown: pikku's default stands in.
DEFAULT_GRACE: float = inspect.signature(WorkflowEngine).parameters["message_grace"].default


class JsonPayloadType(ParamTypeBase):
    """A JSON document, parsed; bad JSON is refused with the parser's reason."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The parsed JSON, or a usage error that shows how to quote it for the shell."""
        if not isinstance(value, str):
            return value
        try:
            return parse_json(value)
        except json.JSONDecodeError as exc:
            self.fail(
                f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {value!r}; "
                "quote it for the shell, e.g. '{\"approved\": true}' or '\"yes\"'",
                param,
                ctx,
            )
        except ValueError as exc:  # nested too deep to decode
            self.fail(f"not valid JSON: {exc}", param, ctx)


@click.command("signal")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name")
@click.argument("payload", metavar="[JSON]", type=JsonPayloadType(), default="null")
@database_url_option
@json_option
@friendly_errors
def signal(run_id: str, name: str, payload: Any, as_json: bool) -> None:
    """Send signal NAME with a JSON payload to a run.

    The payload defaults to null. A name is delivered once: the same payload
    again is a no-op, another payload is refused. The run's next pass sees
    it. That pass is started by a message sent through your Celery app: -A is
    needed even with --database-url.
    """
    pikku = state().workflows(
        "the run's next pass, which sees the signal, is started by a message sent "
        "through your Celery app"
    )
    run = pikku.send_signal(run_id, name, payload, by=cli_operator())
    if as_json:
        summary = render.run_summary(run, pikku.store.now_ms())
        summary["signal"] = {"name": name, "payload": payload}
        echo_json(summary)
        return
    click.echo(f"signal {name!r} sent to run {run.id} ({run.workflow}, {run.status.value})")


@click.command("sweep")
@click.option("--once", is_flag=True, help="Sweep once and exit (else every --interval seconds).")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    metavar="SECONDS",
    help="Pause between sweeps without --once (default: the app's sweep_interval).",
)
@database_url_option
@json_option
@friendly_errors
def sweep(once: bool, interval: float | None, as_json: bool) -> None:
    """Wake stalled runs, as the beat sweep does.

    Lapsed leases, lost messages, due timers and retries, idle runs. Beat
    runs this every sweep_interval already; use it by hand when beat is not
    running, or to see what it would do. With --database-url it sweeps that
    database, still through your app (-A): a sweep's work is sending messages.
    """
    pikku = state().workflows(
        "a sweep's work is sending step and wake-up messages through your Celery app, "
        "with its routes, queue leases and options"
    )
    pause = interval if interval is not None else pikku.sweep_interval
    try:
        while True:
            report = pikku.sweep()
            if as_json:
                echo_json(render.sweep_json(report))
            elif report.skipped:
                click.echo("skipped: another sweep holds the sweep lease right now")
            else:
                render.console().print(render.sweep_table(report))
            if once:
                return
            time.sleep(pause)
    except KeyboardInterrupt:
        return


@click.command("leases")
@database_url_option
@json_option
@friendly_errors
def leases(as_json: bool) -> None:
    """Show each queue's step lease and why, and steps no worker took.

    Per queue: its redelivery horizon and where that came from, the lease
    (``min(horizon, step_lease)``), how often it is renewed, and how soon a
    dead worker's step is taken over (lease + sweep interval).

    Queues: the app's default and task_queues, pikku's overrides, every
    queue a registered task is routed to, and every queue holding steps sent
    longer than ``message_grace`` ago and still unclaimed (named on stderr:
    a queue that stays there has no consumer). With --database-url and no
    -A, only the unclaimed steps: lease lengths come from the app's Celery
    configuration.
    """
    s = state()
    sweep_interval: float | None = None
    if s.has_app:
        pikku = s.workflows()
        rows, transport = _app_rows(pikku), transport_name(pikku.app)
        sweep_interval = pikku.sweep_interval
        title = f"step leases by queue (transport: {transport})"
    else:
        rows, transport = _store_rows(s.store()), None
        title = f"unclaimed steps by queue in {s.database_label()} (lease lengths need -A)"
    if as_json:
        queues = [render.lease_json(r, sweep_interval) for r in rows]
        echo_json({"transport": transport, "queues": queues})
        return
    if rows:
        render.console().print(render.leases_table(rows, title, sweep_interval))
    else:
        click.echo(
            f"no task step in {s.database_label()} has waited unclaimed longer than "
            f"{DEFAULT_GRACE:g} s"
        )
    for row in rows:
        if row.waiting is not None:
            consumer = f" (celery worker -Q {row.queue})" if row.queue is not None else ""
            click.echo(
                f"queue {row.name!r}: {row.waiting[0]} step(s) sent but unclaimed for up to "
                f"{render.human_seconds(row.waiting[1] / 1000)}: is any worker consuming "
                f"it?{consumer}",
                err=True,
            )
    if transport is None:
        click.echo(
            "lease lengths come from your Celery app's configuration (broker transport "
            "options, task_queues, pikku's queue_leases): pass -A/--app to see them; "
            f"steps count as unclaimed after {DEFAULT_GRACE:g} s, "
            "pikku's default message_grace",
            err=True,
        )


def _app_rows(pikku: Pikku) -> list[render.QueueRow]:
    """Every queue the app knows, its lease, its tasks and its unclaimed steps."""
    routed: dict[str, list[str]] = {}
    for task_name in sorted(pikku.app.tasks):
        if task_name.startswith(("celery.", "pikku.")):
            continue
        # the queue its steps land on: task_routes by queue, or by exchange
        # and routing key matched against task_queues' bindings
        queue = pikku.dispatcher.task_queue(task_name)
        routed.setdefault(queue or pikku.queue_leases.default_queue(), []).append(task_name)
    extra = list(routed)
    if pikku.orchestration_queue:
        extra.append(pikku.orchestration_queue)
    default = pikku.queue_leases.default_queue()
    waiting = {
        (queue or default): (steps, oldest_ms)
        for queue, steps, oldest_ms in pikku.store.waiting_by_queue(
            round(pikku.message_grace * 1000)
        )
    }
    extra += list(waiting)
    return [
        render.QueueRow(lease.queue, lease, routed.get(lease.queue, []), waiting.get(lease.queue))
        for lease in pikku.queue_leases.table(extra)
    ]


def _store_rows(store: WorkflowStore) -> list[render.QueueRow]:
    """Without the app: the queues holding unclaimed steps, busiest first."""
    return [
        render.QueueRow(queue, None, [], (steps, oldest_ms))
        for queue, steps, oldest_ms in store.waiting_by_queue(round(DEFAULT_GRACE * 1000))
    ]
