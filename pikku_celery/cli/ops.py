"""``signal``, ``sweep`` and ``leases``: the operator's levers beside ``runs``."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ..celery.queues import transport_name
from . import render
from .common import RUN_ID, ParamTypeBase, echo_json, friendly_errors, json_option, state


class JsonPayloadType(ParamTypeBase):
    """A JSON document, parsed; bad JSON is refused with the parser's reason."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        """The parsed JSON, or a usage error that shows how to quote it for the shell."""
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(
                f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): {value!r}; "
                "quote it for the shell, e.g. '{\"approved\": true}' or '\"yes\"'",
                param,
                ctx,
            )


@click.command("signal")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.argument("name")
@click.argument("payload", metavar="[JSON]", type=JsonPayloadType(), default="null")
@json_option
@friendly_errors
def signal(run_id: str, name: str, payload: Any, as_json: bool) -> None:
    """Send signal NAME with a JSON payload to a run.

    The payload defaults to null. The first signal of a name wins; the run's
    next pass sees it.
    """
    pikku = state().engine()
    run = pikku.send_signal(run_id, name, payload)
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
@json_option
@friendly_errors
def sweep(once: bool, interval: float | None, as_json: bool) -> None:
    """Wake stalled runs, as the beat sweep does.

    Lapsed leases, lost messages, due timers and retries, idle runs. Beat
    runs this every sweep_interval already; use it by hand when beat is not
    running, or to see what it would do.
    """
    pikku = state().engine()
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
@json_option
@friendly_errors
def leases(as_json: bool) -> None:
    """Show each queue's step lease and its source, and steps no worker took.

    Queues: the app's default and task_queues, pikku's overrides, every
    queue a registered task is routed to, and every queue holding steps sent
    longer than ``message_grace`` ago and still unclaimed (named on stderr:
    a queue that stays there has no consumer).
    """
    pikku = state().engine()
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
    rows = [
        (lease, routed.get(lease.queue, []), waiting.get(lease.queue))
        for lease in pikku.queue_leases.table(extra)
    ]
    transport = transport_name(pikku.app)
    if as_json:
        echo_json(
            {
                "transport": transport,
                "queues": [render.lease_json(*row) for row in rows],
            }
        )
        return
    render.console().print(render.leases_table(rows, transport))
    for lease, _, stuck in rows:
        if stuck is not None:
            click.echo(
                f"queue {lease.queue!r}: {stuck[0]} step(s) sent but unclaimed for up to "
                f"{render.human_seconds(stuck[1] / 1000)}: is any worker consuming it? "
                f"(celery worker -Q {lease.queue})",
                err=True,
            )
