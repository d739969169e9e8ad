"""Runs, steps, attempts and leases as rich tables; leases and sweeps as JSON.

Times are UTC, ``YYYY-MM-DD HH:MM:SS`` in tables. Durations and lease
remainders are measured against the store's clock (the database's), the same
clock the leases are judged on. A run's JSON is :mod:`pikku_celery.web.shapes`'s,
shared with the run page (``run_summary`` is re-exported here for the commands
that print one run).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ..celery.queues import QueueLease
from ..engine.deploy_check import DeployCheck
from ..engine.handle import StepHistory
from ..engine.sweep import SweepReport
from ..engine.versions import HASH_PREFIX
from ..model.values import (
    EAGER,
    AttemptStatus,
    AuditEntry,
    RunState,
    StepKind,
    StepState,
    StepStatus,
)
from ..payload import UnreadableValue
from ..web.durations import (
    attempt_duration_ms,
    lease_remaining_ms,
    run_duration_ms,
    step_duration_ms,
    with_next,
)
from ..web.shapes import blocked as _blocked
from ..web.shapes import error_text, run_links, waiting_json
from ..web.shapes import run_summary as run_summary  # re-exported: one run's JSON

STATUS_STYLE = {
    "completed": "green",
    "succeeded": "green",
    "running": "cyan",
    "scheduled": "cyan",
    "pending": "cyan",
    "suspended": "yellow",
    "queued": "yellow",
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


def clock(ms: int | None) -> str:
    """Epoch milliseconds as a UTC wall-clock time for tables (``-`` for none)."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


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


def compact(value: Any, limit: int | None = 120) -> str:
    """``value`` as one line of JSON, cut at ``limit`` characters (None: whole)."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def styled(value: str | None, style: str = "") -> Text:
    """A cell taken literally (no markup): ids, errors and payloads may hold brackets."""
    return Text("-" if value is None else value, style=style)


def status_cell(status: str) -> Text:
    """A status, coloured by what it means."""
    return Text(status, style=STATUS_STYLE.get(status, ""))


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


def lease_json(row: QueueRow, sweep_interval: float | None = None) -> dict[str, Any]:
    """One queue's lease for ``leases --json``: the lease and why, what it was
    chosen from, how often it is renewed, how soon a dead worker's step is
    taken over (lease + ``sweep_interval``), and the steps no worker took."""
    lease, waiting = row.lease, row.waiting
    return {
        "queue": row.queue,
        "seconds": None if lease is None else lease.seconds,
        "source": None if lease is None else lease.source,
        "horizon": None if lease is None else lease.horizon,
        "horizon_source": None if lease is None else lease.horizon_source,
        "step_lease": None if lease is None else lease.step_lease,
        "renewal_s": None if lease is None else lease.renewal,
        "sweep_interval_s": sweep_interval,
        "takeover_within_s": (
            None if lease is None or sweep_interval is None else lease.seconds + sweep_interval
        ),
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
        "admitted": report.admitted,
        "overdue": report.overdue,
        "total": report.total,
        "skipped": report.skipped,
    }


# --- tables ------------------------------------------------------------------


def titled(title: str, table: Table) -> Group:
    """A table under a plain title line (rich pads its own titles with spaces)."""
    return Group(Text(title, style="bold"), table)


def waiting_text(run: RunState, steps: Sequence[StepState]) -> str | None:
    """What a live run waits for, for people: ``waiting for signal NAME``
    (and its timeout) or ``sleeping until TIME``; None for neither."""
    waiting = waiting_json(run, steps)
    if waiting is None:
        return None
    step = next(s for s in steps if s.name == waiting["step"])
    if waiting["for"] == "signal":
        timeout = f", timeout {clock(step.wake_at)} UTC" if step.wake_at is not None else ""
        return f"waiting for signal {waiting['name']}{timeout}"
    return f"sleeping until {clock(step.wake_at)} UTC"


def runs_table(
    runs: Sequence[RunState],
    now: int,
    title: str,
    live_steps: dict[str, list[StepState]] | None = None,
) -> Group:
    """The ``runs list`` table; a live run whose steps are in ``live_steps``
    says what it waits for (a signal, a timer)."""
    table = Table()
    table.add_column("run", no_wrap=True)
    table.add_column("workflow")
    table.add_column("version", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    table.add_column("duration", justify="right", no_wrap=True)
    table.add_column("error / waiting for")
    for run in runs:
        status = run.status.value + (" (cancelling)" if _cancelling(run) else "")
        if _blocked(run):
            status += " (blocked)"
        problem = error_text(run.error) or _prefixed("blocked: ", _blocked(run))
        waiting = waiting_text(run, (live_steps or {}).get(run.id, []))
        table.add_row(
            styled(run.id),
            styled(run.workflow),
            styled(short_version(run.workflow_version)),
            status_cell(status),
            styled(clock(run.created_at)),
            styled(human_seconds(run_duration_ms(run, now) / 1000)),
            styled(problem, "red") if problem or waiting is None else styled(waiting, "cyan"),
        )
    return titled(title, table)


def short_version(version: str | None) -> str:
    """A version as a listing shows it: a source hash cut to 8 digits, as git
    shortens commits (``runs show`` and ``--json`` give it whole)."""
    if version is None:
        return ""
    return version[: len(HASH_PREFIX) + 8] if version.startswith(HASH_PREFIX) else version


def _cancelling(run: RunState) -> bool:
    return run.cancel_requested and not run.status.terminal


def _prefixed(prefix: str, text: str | None) -> str | None:
    return None if text is None else prefix + text


def run_panel(run: RunState, now: int) -> Text:
    """The run's own fields, one ``key  value`` line each."""
    status = run.status.value + (" (cancel requested)" if _cancelling(run) else "")
    rows: list[tuple[str, Text]] = [
        ("run", styled(run.id)),
        ("workflow", styled(run.workflow)),
        ("version", styled(run.workflow_version or "none recorded (started before versions)")),
        ("status", status_cell(status)),
        ("created", styled(clock(run.created_at) + " UTC")),
        ("updated", styled(clock(run.updated_at) + " UTC")),
        ("duration", styled(human_seconds(run_duration_ms(run, now) / 1000))),
    ]
    if run.idempotency_key is not None:
        rows.append(("idempotency key", styled(run.idempotency_key)))
    rows += [(key, styled(linked)) for key, linked in run_links(run)]
    if run.wake_at is not None and not run.status.terminal:
        rows.append(("next wake-up", styled(clock(run.wake_at) + " UTC")))
    if run.deadline_at is not None:
        rows.append(("deadline", styled(clock(run.deadline_at) + " UTC")))
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


def _shown(value: Any, limit: int | None = 60) -> str:
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


def arguments_table(steps: Sequence[StepHistory], limit: int | None) -> Group | None:
    """Each task step's arguments, as JSON cut at ``limit`` characters
    (None: whole); None when no step has any."""
    rows = [h.step for h in steps if h.step.kind == StepKind.TASK]
    rows = [s for s in rows if s.args or s.kwargs]
    if not rows:
        return None
    table = Table()
    table.add_column("step", no_wrap=True)
    table.add_column("args")
    table.add_column("kwargs")
    for step in rows:
        table.add_row(
            styled(step.name),
            styled(_shown(step.args, limit) if step.args else "-"),
            styled(_shown(step.kwargs, limit) if step.kwargs else "-"),
        )
    cut = "" if limit is None else f" (cut at {limit} characters; --full shows them whole)"
    return titled(f"arguments{cut}", table)


def audit_table(entries: Sequence[AuditEntry], limit: int | None) -> Group:
    """What operators did to the run: when (UTC), what, who, from where, with what."""
    table = Table()
    table.add_column("at (UTC)", no_wrap=True)
    table.add_column("action", no_wrap=True)
    table.add_column("by", no_wrap=True)
    table.add_column("from", no_wrap=True)
    table.add_column("details")
    for entry in entries:
        table.add_row(
            styled(clock(entry.at)),
            styled(entry.action.value),
            styled(entry.actor),
            styled(entry.origin),
            styled(compact(entry.details, limit) if entry.details else "-"),
        )
    return titled("operator actions", table)


def _task_id(attempt_task_id: str | None, dispatch: str | None) -> str | None:
    """An attempt's Celery task id; an eager attempt's is its carrier's, so marked."""
    if attempt_task_id is None:
        return None
    return f"{attempt_task_id} (carrier)" if dispatch == EAGER else attempt_task_id


def attempts_table(steps: Sequence[StepHistory], now: int) -> Group:
    """The attempts table of ``runs show``: every attempt of every step, with
    Celery's node name of its worker and the task id of the message that
    carried it (to find its log lines)."""
    table = Table()
    table.add_column("step", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("node", no_wrap=True)
    table.add_column("celery task id", no_wrap=True)
    table.add_column("dispatch", no_wrap=True)
    table.add_column("renewals", justify="right", no_wrap=True)
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
                styled(attempt.node or attempt.worker),
                styled(_task_id(attempt.task_id, attempt.dispatch)),
                styled(attempt.dispatch),
                styled(str(attempt.renewals)),
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


def leases_table(
    rows: Sequence[QueueRow], title: str, sweep_interval: float | None = None
) -> Group:
    """The ``leases`` table: each queue's horizon and its source, the step
    lease and why, its renewal, the worst-case takeover of a dead worker's
    step (lease + ``sweep_interval``), and steps no worker took."""
    table = Table()
    table.add_column("queue", no_wrap=True)
    table.add_column("horizon (from)")
    table.add_column("lease", justify="right", no_wrap=True)
    table.add_column("renewed every", justify="right", no_wrap=True)
    table.add_column("taken over within", justify="right", no_wrap=True)
    table.add_column("tasks routed here")
    table.add_column("unclaimed", justify="right", no_wrap=True)
    for row in rows:
        lease, waiting = row.lease, row.waiting
        takeover = (
            "?"
            if lease is None or sweep_interval is None
            else f"{lease.seconds + sweep_interval:g} s"
        )
        table.add_row(
            styled(row.name),
            styled(
                "needs -A" if lease is None else f"{lease.horizon:g} s ({lease.horizon_source})"
            ),
            styled("?" if lease is None else f"{lease.seconds:g} s"),
            styled("?" if lease is None else f"{lease.renewal:g} s"),
            styled(takeover),
            styled(", ".join(row.tasks) or "-"),
            styled(
                "-"
                if waiting is None
                else f"{waiting[0]} (oldest {human_seconds(waiting[1] / 1000)})",
                "bold red" if waiting else "",
            ),
        )
    notes = [
        Text(f"{row.name}: lease {row.lease.seconds:g} s = {row.lease.source}")
        for row in rows
        if row.lease is not None
    ]
    if notes and sweep_interval is not None:
        notes.append(
            Text(
                f"a dead worker's step is taken over within lease + sweep interval "
                f"({sweep_interval:g} s); its lease is renewed at half its length"
            )
        )
    return Group(titled(title, table), *notes)


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
        ("admitted", "queued runs given a freed concurrency slot"),
        ("overdue", "runs past their deadline woken"),
    ):
        table.add_row(label, str(getattr(report, key)))
    table.add_row(Text("total", style="bold"), Text(str(report.total), style="bold"))
    return titled("sweep", table)


# --- the deploy check --------------------------------------------------------


def _step_json(step: tuple[str, str] | None) -> dict[str, str] | None:
    return None if step is None else {"kind": step[0], "name": step[1]}


def _step_text(step: tuple[str, str] | None) -> str:
    return "-" if step is None else f"{step[0]} {step[1]!r}"


def deploy_check_json(report: DeployCheck) -> dict[str, Any]:
    """``runs check-deploy --json``: the runs that would fail, and the runs
    in flight per workflow version."""
    failing = Counter((c.workflow, c.version) for c in report.failing)
    return {
        "ok": report.ok,
        "checked": report.checked,
        "would_fail": len(report.failing),
        "runs": [
            {
                "run_id": c.run_id,
                "workflow": c.workflow,
                "version": c.version,
                "replays_on": c.replays_on,
                "problem": c.problem,
                "step": None
                if c.index is None
                else {
                    "index": c.index,
                    "recorded": _step_json(c.recorded),
                    "reached": _step_json(c.reached),
                },
                "error": {"type": c.error_type, "message": c.message},
            }
            for c in report.failing
        ],
        "versions": [
            {"workflow": w, "version": v, "runs": n, "would_fail": failing[(w, v)]}
            for (w, v), n in sorted(
                report.versions.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
            )
        ],
    }


def deploy_check_tables(report: DeployCheck) -> Group:
    """``runs check-deploy``: a summary line, the runs that would fail, and
    the runs in flight per workflow version."""
    verdict = (
        "every one replays on this code"
        if report.ok
        else f"{len(report.failing)} would fail with this code"
    )
    parts: list[Any] = [
        Text(
            f"{report.checked} run(s) in flight replayed against the code on disk: {verdict}",
            style="bold green" if report.ok else "bold red",
        )
    ]
    if report.failing:
        table = Table()
        table.add_column("run", no_wrap=True)
        table.add_column("workflow")
        table.add_column("version", no_wrap=True)
        table.add_column("problem", no_wrap=True)
        table.add_column("step", justify="right", no_wrap=True)
        table.add_column("recorded there")
        table.add_column("this code reaches")
        table.add_column("error")
        for c in report.failing:
            table.add_row(
                styled(c.run_id),
                styled(c.workflow),
                styled(c.version or ""),
                styled(c.problem, "red"),
                styled("" if c.index is None else f"#{c.index}"),
                styled(_step_text(c.recorded) if c.index is not None else ""),
                styled(_step_text(c.reached) if c.index is not None else ""),
                styled(compact(f"{c.error_type}: {c.message}", 200), "red"),
            )
        parts.append(titled("runs that would fail", table))
    if report.versions:
        failing = Counter((c.workflow, c.version) for c in report.failing)
        versions = Table()
        versions.add_column("workflow")
        versions.add_column("version started on", no_wrap=True)
        versions.add_column("runs", justify="right")
        versions.add_column("would fail", justify="right")
        for (w, v), n in sorted(report.versions.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            versions.add_row(
                styled(w),
                styled(v or "none recorded"),
                styled(str(n)),
                styled(str(failing[(w, v)])),
            )
        parts.append(titled("runs in flight by version", versions))
    return Group(*parts)
