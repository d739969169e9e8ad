"""A run as plain JSON-ready data: the Flask blueprint's answers, and the example pages'.

Times are ISO 8601 in UTC with ``Z``, to the millisecond, as every JSON
answer of pikku writes them (:mod:`pikku_celery.times`). Tracebacks are
left out unless asked for: an HTTP answer should not hand a caller the
server's source paths by default.
"""

from __future__ import annotations

from typing import Any

from ..engine.handle import RunHandle, StepHistory
from ..model.values import AttemptState, ErrorInfo, RunState
from ..store.events import RunEvent, events_of
from ..times import iso


def error_dict(error: ErrorInfo | None, *, tracebacks: bool = False) -> dict[str, Any] | None:
    """A recorded error as ``{"type", "message"}`` (and ``traceback`` if asked)."""
    if error is None:
        return None
    out = {"type": error.get("type"), "message": error.get("message")}
    if tracebacks and error.get("traceback"):
        out["traceback"] = error["traceback"]
    return out


def run_dict(run: RunState, *, tracebacks: bool = False) -> dict[str, Any]:
    """The run itself, without its steps."""
    return {
        "id": run.id,
        "workflow": run.workflow,
        "status": str(run.status),
        "terminal": run.status.terminal,
        "input": run.input,
        "output": run.output,
        "error": error_dict(run.error, tracebacks=tracebacks),
        "idempotency_key": run.idempotency_key,
        "cancel_requested": run.cancel_requested,
        "parent_run_id": run.parent_run_id,
        "continued_from": run.continued_from,
        "continued_as": run.continued_as,
        "created_at": iso(run.created_at),
        "updated_at": iso(run.updated_at),
    }


def attempt_dict(attempt: AttemptState, *, tracebacks: bool = False) -> dict[str, Any]:
    """One attempt of a step: who ran it, when, and how it ended."""
    return {
        "attempt": attempt.attempt,
        "status": str(attempt.status),
        "worker": attempt.worker,
        "node": attempt.node,
        "task_id": attempt.task_id,
        "dispatch": attempt.dispatch,
        "started_at": iso(attempt.started_at),
        "finished_at": iso(attempt.finished_at),
        "error": error_dict(attempt.error, tracebacks=tracebacks),
    }


def step_dict(history: StepHistory, *, tracebacks: bool = False) -> dict[str, Any]:
    """A step with its attempts, oldest first."""
    step = history.step
    return {
        "name": step.name,
        "kind": str(step.kind),
        "status": str(step.status),
        "task": step.task_name,
        "queue": step.queue,
        "args": step.args,
        "kwargs": step.kwargs,
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "result": step.result,
        "error": error_dict(step.error, tracebacks=tracebacks),
        "child_run_id": step.child_run_id,
        "worker": step.worker,
        "wake_at": iso(step.wake_at),
        "lease_expires_at": iso(step.lease_expires_at),
        "attempts": [attempt_dict(a, tracebacks=tracebacks) for a in history.attempts],
    }


def event_dict(event: RunEvent) -> dict[str, Any]:
    """One progress event (``ctx.set_event``): key, its number among that
    key's events (the highest is the latest value), value, when it was set."""
    return {
        "key": event.key,
        "number": event.number,
        "value": event.value,
        "at": iso(event.created_at),
    }


def run_summary(handle: RunHandle, *, tracebacks: bool = False) -> dict[str, Any]:
    """The run, its steps with their attempts, and its progress events in
    order (raises ``RunNotFoundError``)."""
    out = run_dict(handle.state(), tracebacks=tracebacks)
    history = handle.steps()
    out["steps"] = [step_dict(h, tracebacks=tracebacks) for h in history]
    out["events"] = [event_dict(e) for e in events_of(h.step for h in history)]
    return out
