"""Runs, steps, attempts and leases as JSON (stable keys) and as rich tables.

Times are UTC: ISO 8601 in JSON, ``YYYY-MM-DD HH:MM:SS`` in tables. Durations
and lease remainders are seconds, measured against the store's clock (the
database's), the same clock the leases are judged on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..celery.queues import QueueLease
from ..engine.handle import StepHistory
from ..engine.sweep import SweepReport
from ..payload import UnreadableValue
from ..store.model import (
    AttemptState,
    AttemptStatus,
    ErrorInfo,
    RunState,
    StepKind,
    StepState,
    StepStatus,
)

STATUS_STYLE = {
    "completed": "green",
    "succeeded": "green",
    "running": "cyan",
    "scheduled": "cyan",
    "pending": "cyan",
    "suspended": "yellow",
    "superseded": "yellow",
    "cancelled": "magenta",
    "failed": "red",
    "lease_expired": "red",
}


def console() -> Console:
    """A console on stdout; piped output is not squeezed to 80 columns."""
    out = Console(highlight=False, markup=False, emoji=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, markup=False, emoji=False, width=200)
    return out


# --- values ------------------------------------------------------------------


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as ISO 8601 UTC for JSON output (None stays None)."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def clock(ms: int | None) -> str:
    """Epoch milliseconds as a UTC wall-clock time for tables (``-`` for none)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def seconds(ms: int | None) -> float | None:
    """Milliseconds as seconds, rounded to the millisecond (None stays None)."""
    return None if ms is None else round(ms / 1000, 3)


def human_seconds(value: float | None) -> str:
    """``0.35`` -> ``350 ms``, ``75`` -> ``1 m 15 s``, ``7300`` -> ``2 h 1 m``."""
    if value is None:
        return "-"
    sign, value = ("-" if value < 0 else ""), abs(value)
    if value < 1:
        return f"{sign}{round(value * 1000)} ms"
    if value < 60:
        return f"{sign}{value:.1f} s"
    whole = int(value)
    if whole < 3600:
        return f"{sign}{whole // 60} m {whole % 60} s"
    if whole < 86400:
        return f"{sign}{whole // 3600} h {whole % 3600 // 60} m"
    return f"{sign}{whole // 86400} d {whole % 86400 // 3600} h"


def error_text(error: ErrorInfo | UnreadableValue | None) -> str | None:
    """A recorded error as one line, ``Type: message`` (an unreadable one as stored)."""
    if not error:
        return None
    if isinstance(error, UnreadableValue):
        return repr(error)
    kind, message = error.get("type") or "Error", error.get("message") or ""
    return f"{kind}: {message}" if message else str(kind)


def compact(value: Any, limit: int = 120) -> str:
    """``value`` as one line of JSON, cut at ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def styled(value: str | None, style: str = "") -> Text:
    """A cell taken literally (no markup): ids, errors and payloads may hold brackets."""
    return Text("-" if value is None else value, style=style)


def status_cell(status: str) -> Text:
    """A status, coloured by what it means."""
    return Text(status, style=STATUS_STYLE.get(status, ""))


# --- durations ---------------------------------------------------------------


def run_duration_ms(run: RunState, now: int) -> int:
    """How long the run took, or has been running so far."""
    end = run.updated_at if run.status.terminal else now
    return max(0, end - run.created_at)


def step_duration_ms(history: StepHistory, now: int) -> int | None:
    """First claim to last finish (or now); a step never claimed: its own span."""
    step, attempts = history.step, history.attempts
    if attempts:
        end = attempt_end_ms(attempts[-1], None, now)
        return None if end is None else max(0, end - attempts[0].started_at)
    if step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED):
        return max(0, step.updated_at - step.created_at)
    if step.kind == StepKind.TASK:
        return None  # still waiting for a worker
    return max(0, now - step.created_at)


def attempt_end_ms(attempt: AttemptState, later: AttemptState | None, now: int) -> int | None:
    """When the attempt stopped owning the step.

    A running attempt: now. One that lost its lease records no finish; it
    ended, at the latest, when the next attempt took over.
    """
    if attempt.finished_at is not None:
        return attempt.finished_at
    if attempt.status == AttemptStatus.RUNNING:
        return now
    return later.started_at if later is not None else None


def attempt_duration_ms(attempt: AttemptState, later: AttemptState | None, now: int) -> int | None:
    """How long the attempt owned the step (None when unknown)."""
    end = attempt_end_ms(attempt, later, now)
    return None if end is None else max(0, end - attempt.started_at)


def with_next(attempts: Sequence[AttemptState]) -> list[tuple[AttemptState, AttemptState | None]]:
    """Each attempt beside the one that followed it (None for the last)."""
    return [(a, attempts[i + 1] if i + 1 < len(attempts) else None) for i, a in enumerate(attempts)]


def lease_remaining_ms(step: StepState, now: int) -> int | None:
    """How long the running attempt still owns the step; negative once lapsed."""
    if step.status != StepStatus.RUNNING or step.lease_expires_at is None:
        return None
    return step.lease_expires_at - now


def lease_text(step: StepState, now: int) -> str:
    """What is left of a running step's lease, in words."""
    if step.status != StepStatus.RUNNING:
        return "-"
    remaining = lease_remaining_ms(step, now)
    if remaining is None:
        return "parked"
    if remaining < 0:
        return f"lapsed {human_seconds(-remaining / 1000)} ago"
    return human_seconds(remaining / 1000)


# --- JSON --------------------------------------------------------------------


def run_summary(run: RunState, now: int) -> dict[str, Any]:
    """A run in a listing: no input or output, the error as one line."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "status": run.status.value,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "duration_s": seconds(run_duration_ms(run, now)),
        "cancel_requested": run.cancel_requested,
        "parent_run_id": run.parent_run_id,
        "error": error_text(run.error),
        "blocked": _blocked(run),
    }


def run_detail(run: RunState, now: int) -> dict[str, Any]:
    """The run for ``runs show --json``, without its steps."""
    return {
        **run_summary(run, now),
        "idempotency_key": run.idempotency_key,
        "parent_step_id": run.parent_step_id,
        "wake_at": iso(run.wake_at),
        "input": run.input,
        "output": run.output,
        "error": run.error,  # whole, where the listing shows one line
    }


def attempt_json(attempt: AttemptState, later: AttemptState | None, now: int) -> dict[str, Any]:
    """One attempt for ``runs show --json``."""
    return {
        "attempt": attempt.attempt,
        "status": attempt.status.value,
        "worker": attempt.worker,
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
        "duration_s": seconds(attempt_duration_ms(attempt, later, now)),
        "result": attempt.result,
        "error": attempt.error,
    }


def step_json(history: StepHistory, now: int) -> dict[str, Any]:
    """One step and its attempts for ``runs show --json``."""
    step = history.step
    return {
        "id": step.id,
        "seq": step.seq,
        "name": step.name,
        "kind": step.kind.value,
        "status": step.status.value,
        "task": step.task_name,
        "queue": step.queue,
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "worker": step.worker,
        "created_at": iso(step.created_at),
        "updated_at": iso(step.updated_at),
        "scheduled_at": iso(step.scheduled_at),
        "wake_at": iso(step.wake_at),
        "duration_s": seconds(step_duration_ms(history, now)),
        "lease_expires_at": iso(step.lease_expires_at),
        "lease_remaining_s": seconds(lease_remaining_ms(step, now)),
        "child_run_id": step.child_run_id,
        "result": step.result,
        "error": step.error,
        "attempts": [attempt_json(a, nxt, now) for a, nxt in with_next(history.attempts)],
    }


def show_json(run: RunState, steps: Sequence[StepHistory], now: int) -> dict[str, Any]:
    """``runs show --json``: the run, its steps and their attempts."""
    return {
        "now": iso(now),
        "run": run_detail(run, now),
        "steps": [step_json(h, now) for h in steps],
    }


def lease_json(row: QueueRow) -> dict[str, Any]:
    """One queue's lease for ``leases --json``, with the steps no worker took."""
    lease, waiting = row.lease, row.waiting
    return {
        "queue": row.queue,
        "seconds": None if lease is None else lease.seconds,
        "source": None if lease is None else lease.source,
        "tasks": list(row.tasks),
        "unclaimed_steps": 0 if waiting is None else waiting[0],
        "oldest_unclaimed_s": None if waiting is None else waiting[1] / 1000,
    }


def sweep_json(report: SweepReport) -> dict[str, Any]:
    """``sweep --once --json``: what the sweep did."""
    return {
        "requeued_lapsed": report.requeued_lapsed,
        "expired": report.expired,
        "resent": report.resent,
        "due": report.due,
        "idle": report.idle,
        "total": report.total,
        "skipped": report.skipped,
    }


# --- tables ------------------------------------------------------------------


def titled(title: str, table: Table) -> Group:
    """A table under a plain title line (rich pads its own titles with spaces)."""
    return Group(Text(title, style="bold"), table)


def runs_table(runs: Sequence[RunState], now: int, title: str) -> Group:
    """The ``runs list`` table."""
    table = Table()
    table.add_column("run", no_wrap=True)
    table.add_column("workflow")
    table.add_column("status", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("error")
    for run in runs:
        status = run.status.value + (" (cancelling)" if _cancelling(run) else "")
        if _blocked(run):
            status += " (blocked)"
        table.add_row(
            styled(run.id),
            styled(run.workflow),
            status_cell(status),
            styled(clock(run.created_at)),
            styled(human_seconds(run_duration_ms(run, now) / 1000)),
            styled(error_text(run.error) or _prefixed("blocked: ", _blocked(run)), "red"),
        )
    return titled(title, table)


def _cancelling(run: RunState) -> bool:
    return run.cancel_requested and not run.status.terminal


def _blocked(run: RunState) -> str | None:
    """Why no pass can run a live run (no worker knows its workflow)."""
    return None if run.status.terminal else run.blocked


def _prefixed(prefix: str, text: str | None) -> str | None:
    return None if text is None else prefix + text


def run_panel(run: RunState, now: int) -> Text:
    """The run's own fields, one ``key  value`` line each."""
    status = run.status.value + (" (cancel requested)" if _cancelling(run) else "")
    rows: list[tuple[str, Text]] = [
        ("run", styled(run.id)),
        ("workflow", styled(run.workflow)),
        ("status", status_cell(status)),
        ("created", styled(clock(run.created_at) + " UTC")),
        ("updated", styled(clock(run.updated_at) + " UTC")),
        ("duration", styled(human_seconds(run_duration_ms(run, now) / 1000))),
    ]
    if run.idempotency_key is not None:
        rows.append(("idempotency key", styled(run.idempotency_key)))
    if run.parent_run_id is not None:
        rows.append(("parent run", styled(run.parent_run_id)))
    if run.wake_at is not None and not run.status.terminal:
        rows.append(("next wake-up", styled(clock(run.wake_at) + " UTC")))
    blocked = _blocked(run)
    if blocked is not None:
        rows.append(("blocked", styled(blocked, "red")))
    rows.append(("input", styled(compact(run.input))))
    if run.status.value == "completed":
        rows.append(("output", styled(compact(run.output))))
    if run.error:
        rows.append(("error", styled(error_text(run.error), "red")))
    width = max(len(key) for key, _ in rows) + 2
    return Text("\n").join(Text(key.ljust(width), style="bold") + value for key, value in rows)


def steps_table(steps: Sequence[StepHistory], now: int) -> Group:
    """The steps table of ``runs show``."""
    table = Table()
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("step", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("task / detail")
    table.add_column("queue", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("lease left", justify="right", no_wrap=True)
    table.add_column("result / error")
    for history in steps:
        step = history.step
        retrying = step.status == StepStatus.FAILED and step.wake_at is not None
        status = step.status.value + (" (retry due)" if retrying else "")
        if step.status == StepStatus.SUCCEEDED and step.kind != StepKind.SLEEP:
            outcome: str | None = _shown(step.result)
        else:
            outcome = error_text(step.error)
        table.add_row(
            styled(str(step.seq)),
            styled(step.name),
            styled(step.kind.value),
            status_cell(status),
            styled(f"{step.attempt}/{step.max_attempts}" if step.kind == StepKind.TASK else "-"),
            styled(_detail(step)),
            styled(step.queue),
            styled(step.worker),
            styled(human_seconds(_s(step_duration_ms(history, now)))),
            styled(lease_text(step, now)),
            styled(outcome),
        )
    return titled("steps", table)


def _shown(value: Any, limit: int = 60) -> str:
    """A stored value in a table cell: compact JSON, or an unreadable one as stored."""
    return repr(value) if isinstance(value, UnreadableValue) else compact(value, limit)


def _s(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def _detail(step: StepState) -> str:
    if step.kind == StepKind.TASK:
        return step.task_name or "-"
    if step.kind == StepKind.SLEEP:
        return f"until {clock(step.wake_at)} UTC" if step.wake_at else "timer"
    if step.kind == StepKind.CHILD:
        return f"child run {step.child_run_id}" if step.child_run_id else "child run"
    if step.kind == StepKind.SIGNAL:
        return f"timeout {clock(step.wake_at)} UTC" if step.wake_at else "no timeout"
    return compact(step.result, 60)


def attempts_table(steps: Sequence[StepHistory], now: int) -> Group:
    """The attempts table of ``runs show``: every attempt of every step."""
    table = Table()
    table.add_column("step", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("worker", no_wrap=True)
    table.add_column("started (UTC)", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("error")
    for history in steps:
        for attempt, later in with_next(history.attempts):
            duration = _s(attempt_duration_ms(attempt, later, now))
            running = attempt.status == AttemptStatus.RUNNING
            table.add_row(
                styled(history.step.name),
                styled(str(attempt.attempt)),
                status_cell(attempt.status.value),
                styled(attempt.worker),
                styled(clock(attempt.started_at)),
                styled(human_seconds(duration) + (" so far" if running else "")),
                styled(error_text(attempt.error), "red"),
            )
    return titled("attempts", table)


Waiting = tuple[int, int] | None
"""Steps sent to a queue and unclaimed past ``message_grace``, and the oldest's wait (ms)."""


@dataclass(frozen=True)
class QueueRow:
    """A row of ``leases``: a queue, its lease (None: unknown without the app),
    the tasks routed to it, and the steps no worker took from it."""

    queue: str | None
    lease: QueueLease | None
    tasks: Sequence[str]
    waiting: Waiting

    @property
    def name(self) -> str:
        """The queue as shown: None is the app's default queue, unknown without it."""
        return self.queue if self.queue is not None else "(the app's default queue)"


def leases_table(rows: Sequence[QueueRow], title: str) -> Group:
    """The ``leases`` table: each queue's step lease, its source, and steps no worker took."""
    table = Table()
    table.add_column("queue", no_wrap=True)
    table.add_column("lease", justify="right", no_wrap=True)
    table.add_column("source")
    table.add_column("tasks routed here")
    table.add_column("unclaimed", justify="right", no_wrap=True)
    for row in rows:
        lease, waiting = row.lease, row.waiting
        table.add_row(
            styled(row.name),
            styled("?" if lease is None else f"{lease.seconds:g} s"),
            styled("needs -A" if lease is None else lease.source),
            styled(", ".join(row.tasks) or "-"),
            styled(
                "-"
                if waiting is None
                else f"{waiting[0]} (oldest {human_seconds(waiting[1] / 1000)})",
                "bold red" if waiting else "",
            ),
        )
    return titled(title, table)


def sweep_table(report: SweepReport) -> Group:
    """The ``sweep --once`` table."""
    table = Table()
    table.add_column("what")
    table.add_column("count", justify="right")
    for key, label in (
        ("requeued_lapsed", "lapsed steps sent again"),
        ("expired", "lapsed steps failed (no attempts left)"),
        ("resent", "messages resent (possibly lost)"),
        ("due", "timers, timeouts and retries due"),
        ("idle", "idle runs woken"),
    ):
        table.add_row(label, str(getattr(report, key)))
    table.add_row(Text("total", style="bold"), Text(str(report.total), style="bold"))
    return titled("sweep", table)
