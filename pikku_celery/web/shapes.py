"""Runs, steps, attempts, signals and timers as JSON, with stable keys.

One shape for every reader: the run page's API, ``pikku-celery runs list
--json`` and ``runs show --json``. Times are ISO 8601 UTC with milliseconds and ``Z``
(:func:`pikku_celery.times.iso`);
durations and lease remainders are seconds, measured against the store's
clock (the database's), the clock the leases are judged on. Errors are
whole (type, message, traceback) where one run is shown, one line in a
listing. Values (a step's arguments, results) are whole: a reader bounds
them for display.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..engine.handle import StepHistory
from ..model.values import (
    EAGER,
    JSON,
    AttemptState,
    AuditEntry,
    ErrorInfo,
    RunState,
    StepKind,
    StepState,
    StepStatus,
)
from ..names import SIGNAL_PREFIX
from ..payload import UnreadableValue
from ..store.events import RunEvent, event_step_name, events_of
from ..times import iso as iso  # re-exported: the one spelling of a time
from .durations import (
    attempt_duration_ms,
    attempt_queued_ms,
    lease_remaining_ms,
    run_duration_ms,
    step_duration_ms,
    with_next,
)


def seconds(ms: int | None) -> float | None:
    """Milliseconds as seconds, rounded to the millisecond (None stays None)."""
    return None if ms is None else round(ms / 1000, 3)


def error_text(error: ErrorInfo | UnreadableValue | None) -> str | None:
    """A recorded error as one line, ``Type: message`` (an unreadable one as stored)."""
    if not error:
        return None
    if isinstance(error, UnreadableValue):
        return repr(error)
    kind, message = error.get("type") or "Error", error.get("message") or ""
    return f"{kind}: {message}" if message else str(kind)


def stored(value: JSON | UnreadableValue) -> JSON:
    """A stored value as JSON: one that is not valid JSON (an edited row) as
    the text that says where it sits and what it holds."""
    return repr(value) if isinstance(value, UnreadableValue) else value


def blocked(run: RunState) -> str | None:
    """Why no pass can run a live run (no worker knows its workflow)."""
    return None if run.status.terminal else run.blocked


def waiting_json(run: RunState, steps: Sequence[StepState]) -> dict[str, Any] | None:
    """What a live run waits for, when it is a signal or a durable timer:
    ``{"for": "signal", "name": ..., "until": timeout or None}`` or
    ``{"for": "sleep", "step": ..., "until": ...}`` (the first such step in
    order); None for a settled run or one waiting for neither."""
    if run.status.terminal:
        return None
    for step in steps:
        if step.settled or step.status == StepStatus.SUCCEEDED:
            continue
        if step.kind == StepKind.SIGNAL:
            name = step.name.removeprefix(SIGNAL_PREFIX)
            return {"for": "signal", "name": name, "step": step.name, "until": iso(step.wake_at)}
        if step.kind == StepKind.SLEEP and step.wake_at is not None:
            return {"for": "sleep", "name": None, "step": step.name, "until": iso(step.wake_at)}
    return None


def run_summary(
    run: RunState, now: int, steps: Sequence[StepState] | None = None
) -> dict[str, Any]:
    """A run in a listing: no input or output, the error as one line, and
    what it waits for (from ``steps``, when given)."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,  # the version it started on (None: unknown)
        "status": run.status.value,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
        "duration_s": seconds(run_duration_ms(run, now)),
        "cancel_requested": run.cancel_requested,
        "parent_run_id": run.parent_run_id,
        "idempotency_key": run.idempotency_key,
        "error": error_text(run.error),
        "blocked": blocked(run),
        "waiting": None if steps is None else waiting_json(run, steps),
    }


def run_links(run: RunState) -> list[tuple[str, str]]:
    """The runs this one is linked to, by what they are to it: its parent,
    and the runs before and after it in a ``continue_as_new`` chain."""
    links = [
        ("parent run", run.parent_run_id),
        ("continued from", run.continued_from),
        ("continued as", run.continued_as),
    ]
    return [(what, run_id) for what, run_id in links if run_id is not None]


def run_detail(run: RunState, now: int) -> dict[str, Any]:
    """One run shown whole, without its steps."""
    return {
        **run_summary(run, now),
        "parent_step_id": run.parent_step_id,
        "continued_from": run.continued_from,  # continue_as_new: the run before this one
        "continued_as": run.continued_as,  # and the run after it
        "wake_at": iso(run.wake_at),
        "deadline_at": iso(run.deadline_at),  # start(timeout=): it fails once this passes
        "input": stored(run.input),
        "output": stored(run.output),
        "error": stored(run.error),  # whole, where the listing shows one line
    }


def attempt_json(
    attempt: AttemptState,
    later: AttemptState | None,
    now: int,
    queued_at: int | None = None,
) -> dict[str, Any]:
    """One attempt: who ran it, its wait for a worker, when, and how it ended."""
    return {
        "attempt": attempt.attempt,
        "status": attempt.status.value,
        "worker": attempt.worker,  # the lease holder: host:pid
        "node": attempt.node,  # Celery's node name (celery@host); host:pid with no worker
        "task_id": attempt.task_id,  # the Celery message that carried it
        # "message": its own; "carrier": the message whose task ran it eagerly
        "task_id_of": None if attempt.task_id is None else _task_id_of(attempt),
        "dispatch": attempt.dispatch,  # how it reached its worker: "broker" or "eager"
        "claim_id": attempt.claim_id,
        "queued_at": iso(queued_at),
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
        "duration_s": seconds(attempt_duration_ms(attempt, later, now)),
        "renewals": attempt.renewals,  # its worker's lease renewals
        "renewed_at": iso(attempt.renewed_at),  # the last one
        "result": stored(attempt.result),
        "error": stored(attempt.error),
    }


def _task_id_of(attempt: AttemptState) -> str:
    return "carrier" if attempt.dispatch == EAGER else "message"


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    """One operator action: what, who, from where, when (the store's clock)."""
    return {
        "id": entry.id,
        "action": entry.action.value,
        "actor": entry.actor,
        "origin": entry.origin,
        "at": iso(entry.at),
        "details": entry.details,
    }


def step_json(history: StepHistory, now: int, retried: Sequence[int] = ()) -> dict[str, Any]:
    """One step and its attempts, oldest first; ``retried``: when operators
    retried the run (an attempt after one waited from it)."""
    step = history.step
    attempts = []
    earlier: AttemptState | None = None
    for attempt, later in with_next(history.attempts):
        queued = attempt_queued_ms(step, earlier, attempt.started_at, retried)
        attempts.append(attempt_json(attempt, later, now, queued))
        earlier = attempt
    return {
        "id": step.id,
        "seq": step.seq,
        "name": step.name,
        "kind": step.kind.value,
        "status": step.status.value,
        "task": step.task_name,
        "queue": step.queue,
        "args": stored(step.args),
        "kwargs": stored(step.kwargs),
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "worker": step.worker,
        "created_at": iso(step.created_at),
        "updated_at": iso(step.updated_at),
        "scheduled_at": iso(step.scheduled_at),
        "wake_at": iso(step.wake_at),
        "timeout_s": seconds(step.timeout_ms),  # ctx.step(timeout=): each attempt's limit
        "duration_s": seconds(step_duration_ms(history, now)),
        "lease_expires_at": iso(step.lease_expires_at),
        "lease_remaining_s": seconds(lease_remaining_ms(step, now)),
        "child_run_id": step.child_run_id,
        "result": stored(step.result),
        "error": stored(step.error),
        "attempts": attempts,
    }


def signals_json(signals: dict[str, JSON], steps: Sequence[StepState]) -> list[dict[str, Any]]:
    """Each signal sent, and whether the run's wait for it has taken it."""
    taken = {
        s.name[len(SIGNAL_PREFIX) :]
        for s in steps
        if s.kind == StepKind.SIGNAL and s.status == StepStatus.SUCCEEDED
    }
    return [
        {"name": name, "payload": stored(payload), "taken": name in taken}
        for name, payload in signals.items()
    ]


def timers_json(steps: Sequence[StepState], now: int) -> list[dict[str, Any]]:
    """The durable timers the run waits on: sleeps, signal timeouts, retries.

    A timer that fired is no longer here (its step keeps no ``wake_at``; the
    timeline shows the step's span). ``due_in_s`` counts down on the store's
    clock; negative once due (the sweep fires it within its interval).
    """
    timers: list[dict[str, Any]] = []
    for step in steps:
        if step.wake_at is None:
            continue
        if step.kind == StepKind.SLEEP:
            kind, pending = "sleep", step.status != StepStatus.SUCCEEDED
        elif step.kind == StepKind.SIGNAL:
            kind, pending = "signal_timeout", not step.settled
        elif step.kind == StepKind.TASK and step.status == StepStatus.FAILED:
            kind, pending = "retry", True
        else:
            continue
        timers.append(
            {
                "step": step.name,
                "kind": kind,
                "wake_at": iso(step.wake_at),
                "pending": pending,
                "due_in_s": seconds(step.wake_at - now) if pending else None,
            }
        )
    return timers


def event_json(event: RunEvent) -> dict[str, Any]:
    """One progress event: key, its number among that key's events (the
    highest is the latest value), the value, when it was recorded and the
    value step that holds it."""
    return {
        "key": event.key,
        "number": event.number,
        "value": stored(event.value),
        "at": iso(event.created_at),
        "step": event_step_name(event.key, event.number),
    }


def events_json(steps: Sequence[StepState]) -> list[dict[str, Any]]:
    """The run's progress events (``ctx.set_event``), in the order set."""
    return [event_json(event) for event in events_of(steps)]
