"""``pikku-celery runs events RUN``: a run's progress events (``ctx.set_event``).

Reads the store alone, like ``runs show`` (which ends with the same table).
``--follow`` prints each new event as the run records it, until the run ends.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import click
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..errors import RunNotFoundError
from ..names import MAX_EVENT_KEY_LENGTH, check_name
from ..ports.store import WorkflowStore
from ..store.events import RunEvent, events_of
from ..web.shapes import event_json
from . import render
from .common import RUN_ID, database_url_option, echo_json, friendly_errors, json_option, state

VALUE_SHOWN = 80
"""Characters of an event's value the table prints before cutting it short."""

FOLLOW_POLL = 0.5
"""How often ``--follow`` reads the run's steps (seconds)."""


def events_table(events: Sequence[RunEvent], limit: int | None = VALUE_SHOWN) -> Text | Group:
    """The events in order: key, number, value (cut at ``limit``) and when set."""
    if not events:
        return Text("no events set")
    table = Table()
    table.add_column("set at", no_wrap=True)
    table.add_column("key", no_wrap=True)
    table.add_column("#", justify="right")
    table.add_column("value")
    for event in events:
        table.add_row(
            render.clock(event.created_at),
            render.styled(event.key),
            str(event.number),
            render.styled(render.compact(event.value, limit)),
        )
    return render.titled("events", table)


def _events(store: WorkflowStore, run_id: str, key: str | None) -> list[RunEvent]:
    if key is not None:
        check_name(key, "event key", MAX_EVENT_KEY_LENGTH)
    steps = store.event_steps(run_id, key)
    if not steps and store.get_run(run_id) is None:
        raise RunNotFoundError(f"no workflow run {run_id!r}")
    return events_of(steps)


@click.command("events")
@click.argument("run_id", metavar="RUN", type=RUN_ID)
@click.option("--key", metavar="KEY", help="Only the events of this key.")
@click.option("--follow", is_flag=True, help="Keep printing new events until the run ends.")
@click.option("--full", is_flag=True, help="Show values whole, not cut.")
@database_url_option
@json_option
@friendly_errors
def run_events(run_id: str, key: str | None, follow: bool, full: bool, as_json: bool) -> None:
    """Show the progress events a run set (ctx.set_event), in order.

    Each event's key, its number among that key's events (the highest is
    the key's latest value), its value and when it was recorded. With
    --follow, new events are printed as the run records them (--json: one
    JSON object a line) until the run ends.
    """
    store = state().store()
    limit = None if full else VALUE_SHOWN

    def chosen() -> list[RunEvent]:
        return _events(store, run_id, key)

    if not follow:
        events = chosen()
        if as_json:
            echo_json([event_json(e) for e in events])
        else:
            render.console().print(events_table(events, limit))
        return
    shown = 0
    while True:
        run = store.get_run(run_id)
        events = chosen()
        for event in events[shown:]:
            if as_json:
                click.echo(render.compact(event_json(event), None))
            else:
                value = render.compact(event.value, limit)
                click.echo(f"{render.clock(event.created_at)}  {event.key}#{event.number}  {value}")
        shown = len(events)
        if run is None or run.status.terminal:
            if not as_json:
                click.echo(f"run {run_id} {'is gone' if run is None else run.status}")
            return
        time.sleep(FOLLOW_POLL)
