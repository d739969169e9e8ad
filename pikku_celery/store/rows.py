"""A run, a step and an attempt as rows, and back: how the SQL store keeps them.

A stored value that is not JSON (a row edited by hand) is reported with the
column it sits in (:func:`pikku_celery.payload.read_stored`), never returned
half-read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from ..model.plan import OutcomeWrite, Resolved
from ..model.values import (
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Delivery,
    NewRun,
    RunState,
    RunStatus,
    StepKind,
    StepState,
    StepStatus,
)
from ..payload import read_stored
from ..sql.schema import step_table

STEP_COLUMNS = tuple(c.name for c in step_table.c)

# --- rows -> values ----------------------------------------------------------
# Where a stored value that is not JSON sits (payload.read_stored formats it
# only for such a value).
_RUN_COLUMN = "run {} column {}"
SIGNAL_PLACE = "run {} signal {!r} payload"
_STEP_COLUMN = "run {} step {!r} column {}"
_ATTEMPT_COLUMN = "attempt {} of step {} column {}"


def run_from(row: Any, prefix: str = "") -> RunState:
    """The run in ``row`` (its columns named ``prefix`` + column)."""
    m = row._mapping
    p = prefix
    run_id = m[p + "id"]
    return RunState(
        id=run_id,
        workflow=m[p + "workflow"],
        status=RunStatus(m[p + "status"]),
        input=read_stored(m[p + "input"], _RUN_COLUMN, run_id, "input"),
        output=read_stored(m[p + "output"], _RUN_COLUMN, run_id, "output"),
        error=read_stored(m[p + "error"], _RUN_COLUMN, run_id, "error"),
        idempotency_key=m[p + "idempotency_key"],
        parent_run_id=m[p + "parent_run_id"],
        parent_step_id=m[p + "parent_step_id"],
        cancel_requested=bool(m[p + "cancel_requested"]),
        version=m[p + "version"],
        wake_at=m[p + "wake_at"],
        next_sweep_at=m[p + "next_sweep_at"],
        sweep_count=m[p + "sweep_count"],
        created_at=m[p + "created_at"],
        updated_at=m[p + "updated_at"],
        depth=m[p + "depth"],
        blocked=m[p + "blocked"],
        workflow_version=m[p + "workflow_version"],
        trace_context=read_stored(m[p + "trace_context"], _RUN_COLUMN, run_id, "trace_context"),
        deadline_at=m[p + "deadline_at"],
        # a pass's one-statement read leaves them out: they matter once a run ended
        continued_as=m.get(p + "continued_as"),
        continued_from=m.get(p + "continued_from"),
    )


def step_from(row: Any) -> StepState:
    """The step in ``row``."""
    run_id, name = row.run_id, row.name
    args = read_stored(row.args, _STEP_COLUMN, run_id, name, "args")
    kwargs = read_stored(row.kwargs, _STEP_COLUMN, run_id, name, "kwargs")
    return StepState(
        id=row.id,
        run_id=row.run_id,
        name=row.name,
        seq=row.seq,
        kind=StepKind(row.kind),
        status=StepStatus(row.status),
        task_name=row.task_name,
        queue=row.queue,
        args=[] if args is None else args,
        kwargs={} if kwargs is None else kwargs,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        retry_delay=row.retry_delay,
        backoff=row.backoff,
        lease_expires_at=row.lease_expires_at,
        wake_at=row.wake_at,
        child_run_id=row.child_run_id,
        result=read_stored(row.result, _STEP_COLUMN, run_id, name, "result"),
        error=read_stored(row.error, _STEP_COLUMN, run_id, name, "error"),
        worker=row.worker,
        scheduled_at=row.scheduled_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        route=read_stored(row.route, _STEP_COLUMN, run_id, name, "route"),
        claim_id=row.claim_id,
        timeout_ms=row.timeout_ms,
    )


# The columns of select(step_table), in order: what steps_from unpacks.
_STEP_ORDER = (
    "id",
    "run_id",
    "name",
    "seq",
    "kind",
    "status",
    "task_name",
    "queue",
    "args",
    "kwargs",
    "attempt",
    "max_attempts",
    "retry_delay",
    "backoff",
    "lease_expires_at",
    "wake_at",
    "child_run_id",
    "result",
    "error",
    "worker",
    "scheduled_at",
    "created_at",
    "updated_at",
    "route",
    "claim_id",
    "next_sweep_at",
    "sweep_count",
    "timeout_ms",
)
if STEP_COLUMNS != _STEP_ORDER:  # a column added to the table must be added here too
    raise RuntimeError(f"steps_from unpacks {_STEP_ORDER}, the step table has {STEP_COLUMNS}")
_KINDS = {kind.value: kind for kind in StepKind}
_STATUSES = {status.value: status for status in StepStatus}


def _stored(text: str | None, run_id: str, name: str, column: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return read_stored(text, _STEP_COLUMN, run_id, name, column)


def steps_from(rows: Iterable[Any]) -> list[StepState]:
    """The steps in ``rows`` (of ``select(step_table)``), each as :func:`step_from`
    makes it, for reads of thousands (the deploy check): unpacked by position,
    one dict lookup per enum, rather than by name and enum call."""
    steps = []
    for (
        sid,
        run_id,
        name,
        seq,
        kind,
        status,
        task_name,
        queue,
        args,
        kwargs,
        attempt,
        max_attempts,
        retry_delay,
        backoff,
        lease_expires_at,
        wake_at,
        child_run_id,
        result,
        error,
        worker,
        scheduled_at,
        created_at,
        updated_at,
        route,
        claim_id,
        _next_sweep_at,  # the sweep's own bookkeeping: not part of a step's state
        _sweep_count,
        timeout_ms,
    ) in rows:
        decoded_args = _stored(args, run_id, name, "args")
        decoded_kwargs = _stored(kwargs, run_id, name, "kwargs")
        steps.append(
            StepState(
                id=sid,
                run_id=run_id,
                name=name,
                seq=seq,
                kind=_KINDS[kind],
                status=_STATUSES[status],
                task_name=task_name,
                queue=queue,
                args=[] if decoded_args is None else decoded_args,
                kwargs={} if decoded_kwargs is None else decoded_kwargs,
                attempt=attempt,
                max_attempts=max_attempts,
                retry_delay=retry_delay,
                backoff=backoff,
                lease_expires_at=lease_expires_at,
                wake_at=wake_at,
                child_run_id=child_run_id,
                result=_stored(result, run_id, name, "result"),
                error=_stored(error, run_id, name, "error"),
                worker=worker,
                scheduled_at=scheduled_at,
                created_at=created_at,
                updated_at=updated_at,
                route=_stored(route, run_id, name, "route"),
                claim_id=claim_id,
                timeout_ms=timeout_ms,
            )
        )
    return steps


def attempt_from(row: Any) -> AttemptState:
    """The attempt in ``row``."""
    place = (row.attempt, row.step_id)
    return AttemptState(
        step_id=row.step_id,
        attempt=row.attempt,
        status=AttemptStatus(row.status),
        worker=row.worker,
        result=read_stored(row.result, _ATTEMPT_COLUMN, *place, "result"),
        error=read_stored(row.error, _ATTEMPT_COLUMN, *place, "error"),
        started_at=row.started_at,
        finished_at=row.finished_at,
        claim_id=row.claim_id,
        dispatch=row.dispatch,
        renewals=row.renewals,
        renewed_at=row.renewed_at,
        task_id=row.task_id,
        node=row.node,
    )


def audit_from(row: Any) -> AuditEntry:
    """The audit entry in ``row``."""
    details = read_stored(row.details, "run {} audit entry {} details", row.run_id, row.id) or {}
    return AuditEntry(
        id=int(row.id),
        run_id=row.run_id,
        action=AuditAction(row.action),
        actor=row.actor,
        origin=row.origin,
        details=details if isinstance(details, dict) else {"unreadable": repr(details)},
        at=int(row.at),
    )


def step_params(step: StepState, args: str, kwargs: str, result: str | None) -> dict[str, Any]:
    """The step as insert parameters, its values already JSON text."""
    return {
        "id": step.id,
        "run_id": step.run_id,
        "name": step.name,
        "seq": step.seq,
        "kind": step.kind.value,
        "status": step.status.value,
        "task_name": step.task_name,
        "queue": step.queue,
        "args": args,
        "kwargs": kwargs,
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "retry_delay": float(step.retry_delay),
        "backoff": float(step.backoff),
        "lease_expires_at": step.lease_expires_at,
        "wake_at": step.wake_at,
        "child_run_id": step.child_run_id,
        "result": result,
        "error": None,
        "worker": step.worker,
        "scheduled_at": step.scheduled_at,
        "created_at": step.created_at,
        "updated_at": step.updated_at,
        "route": None if step.route is None else json.dumps(step.route, separators=(",", ":")),
        "claim_id": step.claim_id,
        "next_sweep_at": 0,  # a new step: never re-sent by the sweep
        "sweep_count": 0,
        "timeout_ms": step.timeout_ms,
    }


def attempt_params(
    step: StepState,
    status: AttemptStatus,
    dispatch: str | None,
    started_at: int,
    delivery: Delivery | None = None,
) -> dict[str, Any]:
    """A new attempt row of ``step``'s current attempt, as insert parameters
    (every column, so rows of different kinds batch in one statement)."""
    return {
        "step_id": step.id,
        "attempt": step.attempt,
        "run_id": step.run_id,
        "status": status.value,
        "worker": step.worker,
        "result": None,
        "error": None,
        "started_at": started_at,
        "finished_at": None,
        "claim_id": step.claim_id,
        "dispatch": dispatch,
        "renewals": 0,
        "renewed_at": None,
        "task_id": None if delivery is None else delivery.task_id,
        "node": None if delivery is None else delivery.node,
    }


def run_params(new: NewRun, input_text: str, now: int | None = None) -> dict[str, Any]:
    """A new run as insert parameters (its timestamps are the database's).

    ``now``, read from the database, places its deadline; without it the
    caller places it (:func:`deadline_of`) once it has read the clock."""
    return {
        "id": new.id,
        "workflow": new.workflow,
        "status": new.status.value,
        "input": input_text,
        "output": None,
        "error": None,
        "idempotency_key": new.idempotency_key,
        "parent_run_id": new.parent_run_id,
        "parent_step_id": new.parent_step_id,
        "cancel_requested": False,
        "version": 1,
        "wake_at": None,
        "next_sweep_at": None,
        "sweep_count": 0,
        "depth": new.depth,
        "blocked": None,
        "workflow_version": new.workflow_version,
        "trace_context": (
            None
            if new.trace_context is None
            else json.dumps(new.trace_context, separators=(",", ":"))
        ),
        "deadline_at": deadline_of(new, now),
        "continued_as": None,
        "continued_from": new.continued_from,
    }


def deadline_of(new: NewRun, created_at: int | None) -> int | None:
    """When a run created at ``created_at`` (the store's clock) times out."""
    if new.timeout_ms is None or created_at is None:
        return None
    return created_at + new.timeout_ms


def attempt_row_params(attempt: AttemptState, run_id: str) -> dict[str, Any]:
    """A pass's new attempt row (an eager claim, a child run's park) as
    insert parameters, every column as :func:`attempt_params` writes them."""
    return {
        "step_id": attempt.step_id,
        "attempt": attempt.attempt,
        "run_id": run_id,
        "status": attempt.status.value,
        "worker": attempt.worker,
        "result": None,
        "error": None,
        "started_at": attempt.started_at,
        "finished_at": None,
        "claim_id": attempt.claim_id,
        "dispatch": attempt.dispatch,
        "renewals": 0,
        "renewed_at": None,
        "task_id": attempt.task_id,
        "node": attempt.node,
    }


def outcome_params(written: OutcomeWrite, now: int) -> dict[str, Any]:
    """The binds of a fenced outcome write (``complete``, ``fail``, ``fail_retry``)."""
    done = written.outcome
    params: dict[str, Any] = {
        "p_id": done.step_id,
        "p_attempt": done.attempt,
        "p_claim": done.claim_id,
        "p_now": now,
    }
    if done.ok:
        params["p_result"] = written.text
    else:
        params["p_error"] = written.text
        params["p_delay_ms"] = written.delay_ms
    return params


def resolve_params(res: Resolved, now: int) -> dict[str, Any]:
    """The binds of a step the pass settles (``resolve``)."""
    step = res.step
    return {
        "p_id": step.id,
        "p_status": step.status.value,
        "p_result": res.result,
        "p_error": res.error,
        "p_now": now,
    }


def resolve_attempt_params(res: Resolved, now: int) -> dict[str, Any]:
    """The binds of a settled child step's attempt (``resolve_attempt``)."""
    assert res.attempt is not None
    return {
        **resolve_params(res, now),
        "p_attempt": res.step.attempt,
        "p_status": res.attempt.value,
    }
