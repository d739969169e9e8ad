"""``pikku-celery schedules list``: every schedule, its last run and its next tick.

With ``-A`` the app's schedules are listed (those that never ticked too),
their next tick computed from the spec on the store's clock; with only
``--database-url`` the rows of ``pikku_schedule`` are (the next tick each
recorded). A schedule whose row names a run shows that run's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import click
from rich.table import Table

from ..ports.store import WorkflowStore
from ..schedule.model import Schedule, ScheduleState, iso
from ..schedule.store import ScheduleStore
from . import render
from .common import database_url_option, echo_json, friendly_errors, json_option, state


@click.group()
def schedules() -> None:
    """Look at the schedules: which workflow each starts, when it last ran, when next."""


@dataclass(frozen=True)
class Listed:
    """One schedule as listed: its definition (when the app has it) and its row."""

    name: str
    schedule: Schedule | None
    row: ScheduleState | None

    def next_tick(self, now: int) -> int | None:
        """The next tick to start: the one after the last handled, else after now."""
        if self.schedule is None:
            return None if self.row is None else self.row.next_tick_ms
        after = now if self.row is None else self.row.last_tick_ms
        return self.schedule.spec.next_after(after)

    def json(self, now: int, run_status: str | None) -> dict[str, Any]:
        """The ``--json`` form: times as ISO 8601 UTC and epoch ms."""
        s, row, next_tick = self.schedule, self.row, self.next_tick(now)
        return {
            "name": self.name,
            "workflow": s.workflow if s else row.workflow if row else None,
            "spec": s.spec.describe() if s else row.spec if row else None,
            "overlap": s.overlap.value if s else None,
            "catch_up": s.catch_up if s else None,
            "defined": s is not None,
            "last_tick": None if row is None else iso(row.last_tick_ms),
            "last_tick_ms": None if row is None else row.last_tick_ms,
            "last_run_id": None if row is None else row.last_run_id,
            "last_run_status": run_status,
            "next_tick": None if next_tick is None else iso(next_tick),
            "next_tick_ms": next_tick,
            "due": next_tick is not None and next_tick <= now,
        }


def _sources() -> tuple[WorkflowStore, ScheduleStore, dict[str, Schedule]]:
    from ..schedule.sql import SQLScheduleStore
    from ..store.sql import SQLWorkflowStore

    cli = state()
    store = cli.store()
    if isinstance(store, SQLWorkflowStore):
        store.prepare()  # an embedded (SQLite) store makes its tables on first use
    if cli.has_app:
        pikku = cli.workflows()
        return store, pikku.schedule_store, dict(pikku.schedules)
    assert isinstance(store, SQLWorkflowStore)  # --database-url alone is always SQL
    return store, SQLScheduleStore(store.engine), {}


@schedules.command("list")
@database_url_option
@json_option
@friendly_errors
def list_schedules(as_json: bool) -> None:
    """List schedules with their last tick, its run and the next tick.

    Times are UTC, "now" is the store's clock. A next tick already past means
    the schedule is due: no beat has run its pass since (is beat running?).
    """
    store, schedule_store, defined = _sources()
    now = schedule_store.now_ms()
    rows = schedule_store.schedule_states()
    listed = [Listed(n, defined.get(n), rows.get(n)) for n in sorted(set(defined) | set(rows))]
    statuses: dict[str, str] = {}
    for item in listed:
        if item.row is not None and item.row.last_run_id is not None:
            run = store.get_run(item.row.last_run_id)
            if run is not None:
                statuses[item.name] = run.status.value
    if as_json:
        echo_json(
            {"now": iso(now), "schedules": [i.json(now, statuses.get(i.name)) for i in listed]}
        )
        return
    out = render.console()
    if not listed:
        out.print("no schedules: none defined in the app and none recorded in the store")
        return
    table = Table()
    for column in ("schedule", "workflow", "when", "overlap", "last tick", "last run", "next tick"):
        table.add_column(column)
    for item in listed:
        shown = item.json(now, statuses.get(item.name))
        next_ms = shown["next_tick_ms"]
        if next_ms is None:
            next_text = "-"
        elif next_ms <= now:
            next_text = f"{render.clock(next_ms)} (due)"
        else:
            next_text = (
                f"{render.clock(next_ms)} (in {render.human_seconds((next_ms - now) / 1000)})"
            )
        run_id = shown["last_run_id"]
        run_text = "-" if run_id is None else f"{run_id} {statuses.get(item.name, 'unknown')}"
        overlap = (
            "-" if item.schedule is None else f"{shown['overlap']}, catch_up {shown['catch_up']}"
        )
        table.add_row(
            render.styled(item.name),
            render.styled(shown["workflow"]),
            render.styled(shown["spec"]),
            overlap,
            render.clock(shown["last_tick_ms"]),
            render.styled(run_text),
            next_text,
        )
    out.print(render.titled(f"schedules (UTC; now {render.clock(now)})", table))
