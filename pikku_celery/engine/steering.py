"""Steering a run from outside: a signal, a cancel, a retry, each audited.

What :meth:`WorkflowEngine.send_signal
<pikku_celery.engine.core.WorkflowEngine.send_signal>`, ``cancel`` and
``retry`` do: each rides out a store outage, writes the run's audit trail
(done ``by`` an operator, default ``"api"``) and wakes the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import RunSettledError
from ..model.values import JSON, AuditAction, Operator, RunState, RunStatus, StepStatus
from ..names import MAX_SIGNAL_NAME_LENGTH, check_name
from .audit import API_OPERATOR, signal_details
from .concurrency import queued_wakeup
from .outage import ride_out
from .run_ids import parse_run_id

if TYPE_CHECKING:
    from .core import WorkflowEngine


def send_signal(
    engine: WorkflowEngine, run_id: str, name: str, payload: JSON, by: Operator | None
) -> RunState:
    """Deliver signal ``name`` to the run, audited and the run woken."""
    check_name(name, "signal name", MAX_SIGNAL_NAME_LENGTH)
    text = engine.check_input(payload, f"signal {name!r}", "payload")
    rid = parse_run_id(run_id)
    run = ride_out(
        engine,
        lambda: engine.store.send_signal(rid, name, payload),
        f"sending signal {name!r} to run {rid}",
    )
    audit(engine, run.id, AuditAction.SIGNAL, by, signal_details(name, payload, text))
    engine.dispatcher.wake_run(run.id, reason="signal")
    return run


def cancel_run(engine: WorkflowEngine, run_id: str, by: Operator | None) -> RunState:
    """Ask the run to end as cancelled; a settled run refuses (RunSettledError)."""
    rid = parse_run_id(run_id)
    run = ride_out(engine, lambda: engine.store.request_cancel(rid), f"cancelling run {rid}")
    if run.status.terminal:
        raise RunSettledError(f"workflow run {run.id} is already {run.status}")
    audit(engine, run.id, AuditAction.CANCEL, by, {})
    if run.status == RunStatus.QUEUED:
        queued_wakeup(engine, run)  # ended now: no pass waits for it
        return engine.store.get_run(run.id) or run
    engine.dispatcher.wake_run(run.id, reason="cancel")
    return run


def retry_run(engine: WorkflowEngine, run_id: str, by: Operator | None) -> RunState:
    """Resume a failed run from its failed steps; the audit entry keeps the
    error the retry clears, and the failed steps' names."""
    rid = parse_run_id(run_id)

    def read() -> tuple[RunState | None, list[str]]:
        steps = engine.store.get_steps(rid)
        return engine.store.get_run(rid), [s.name for s in steps if s.status == StepStatus.FAILED]

    before, failed = ride_out(engine, read, f"reading run {rid}")
    run = ride_out(engine, lambda: engine.store.retry_run(rid), f"retrying run {rid}")
    previous = None if before is None else before.error
    details: dict[str, JSON] = {"previous_error": previous, "failed_steps": failed}
    audit(engine, run.id, AuditAction.RETRY, by, details)
    engine.dispatcher.wake_run(run.id, reason="retry")
    return run


def audit(
    engine: WorkflowEngine,
    run_id: str,
    action: AuditAction,
    by: Operator | None,
    details: dict[str, JSON],
) -> None:
    """Append ``action`` to the run's audit trail, done ``by`` (default ``"api"``)."""
    engine.store.record_action(run_id, action, by or API_OPERATOR, details)
