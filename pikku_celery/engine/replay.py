"""One replay pass: run the body against the recorded steps, decide what's next.

Pure: it reads a :class:`RunView` and returns a :class:`Decision`; the store
applies it in the pass's transaction.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from ..errors import (
    PayloadError,
    UnknownPatchError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
)
from ..payload import check_json
from ..store.model import Decision, ErrorInfo, RunStatus, RunView, StepKind
from .context import Context, Suspend, pass_state
from .limits import Limits, PassBudgetSpent
from .workflow import Workflow


def error_info(exc: BaseException) -> ErrorInfo:
    """How a failure is recorded: type, message and traceback text."""
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc)),
    }


def cancelled(view: RunView) -> Decision:
    """End the run as cancelled and ask its live children to stop too."""
    children = [
        s.child_run_id
        for s in view.steps
        if s.kind == StepKind.CHILD and s.child_run_id is not None and not s.settled
    ]
    return Decision(
        run_status=RunStatus.CANCELLED,
        error={"type": "WorkflowCancelledError", "message": "cancelled", "traceback": ""},
        cancel_children=children,
    )


def replay(
    workflow: Workflow,
    view: RunView,
    resolve_task: Callable[[Any], str],
    task_queue: Callable[..., str | None],
    lookup_workflow: Callable[[Any], Workflow],
    limits: Limits | None = None,
) -> Decision:
    """Run ``workflow``'s body once over ``view`` and say what to do next."""
    if view.run.cancel_requested:
        return cancelled(view)
    ctx = Context(view, resolve_task, task_queue, lookup_workflow, limits)
    try:
        output = workflow.run_body(ctx, view.run.input)
    except Suspend:
        decision, wakes = pass_state(ctx)
        decision.wake_at = min(wakes) if wakes else None
        return decision
    except UnknownPatchError:
        raise  # not this worker's to decide: the run waits for code that knows the patch
    except PassBudgetSpent as spent:
        # Nothing the pass recorded is kept: a runaway body's steps are noise.
        return Decision(run_status=RunStatus.FAILED, error=error_info(WorkflowLimitError(spent)))
    except (WorkflowNondeterminismError, WorkflowLimitError) as exc:
        # Neither keeps what this pass recorded: steps past a limit (or out of
        # order) would only be rows that no replay can account for.
        return Decision(run_status=RunStatus.FAILED, error=error_info(exc))
    except Exception as exc:
        decision, _ = pass_state(ctx)
        decision.run_status = RunStatus.FAILED
        decision.error = error_info(exc)
        return decision
    decision, _ = pass_state(ctx)
    try:
        depth = (limits or Limits()).max_payload_depth
        check_json(output, f"workflow {workflow.name!r}", "output", depth)
    except PayloadError as exc:
        decision.run_status = RunStatus.FAILED
        decision.error = error_info(exc)
        return decision
    decision.run_status = RunStatus.COMPLETED
    decision.output = output
    return decision
