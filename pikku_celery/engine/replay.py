"""One replay pass: run the body against the recorded steps, decide what's next.

Pure: it reads a :class:`RunView` and returns a :class:`Decision`; the store
applies it in the pass's transaction.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..errors import (
    PayloadError,
    UnknownPatchError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
)
from ..model.values import JSON, Decision, ErrorInfo, RunStatus, RunView, StepKind
from ..payload import check_json
from . import resume as resumes
from .context import Context, Suspend, pass_state
from .continuing import ContinueAsNew
from .limits import Limits, PassBudgetSpent
from .readable import check_readable
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
    *,
    resume: bool = True,
) -> Decision:
    """Run ``workflow``'s body over ``view`` and say what to do next.

    With ``resume``, a body this thread holds parked for the run is resumed
    when ``view`` extends what it holds (see :mod:`.resume`), and a body
    that waits is kept for the next pass; otherwise, and without it, the
    body is replayed from the top. Either way the decision is the same.
    """
    limits = limits or Limits()
    if view.run.cancel_requested:
        resumes.forget(view.run.id)
        return cancelled(view)
    if not resume or limits.resume_max_bodies == 0:
        check_readable(view)
        ctx = Context(view, resolve_task, task_queue, lookup_workflow, limits)
        return _decide(workflow, ctx, lambda: workflow.run_body(ctx, view.run.input), limits)
    body = resumes.take(workflow, view)  # checks what it reads anew
    if body is None:
        check_readable(view)
        ctx = Context(view, resolve_task, task_queue, lookup_workflow, limits)
        body = resumes.Body(workflow, ctx, view.run.input)
    decision = _decide(workflow, body.ctx, body.advance, limits)
    resumes.keep(view.run.id, body, limits)
    return decision


def _decide(workflow: Workflow, ctx: Context, run: Callable[[], JSON], limits: Limits) -> Decision:
    """The decision of one pass of ``run`` (the body, replayed or resumed)."""
    try:
        output = run()
    except Suspend:
        decision, wakes = pass_state(ctx)
        return replace(decision, wake_at=min(wakes) if wakes else None)
    except ContinueAsNew as cont:
        decision, _ = pass_state(ctx)
        return replace(decision, run_status=RunStatus.COMPLETED, successor=cont.successor)
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
        return replace(decision, run_status=RunStatus.FAILED, error=error_info(exc))
    decision, _ = pass_state(ctx)
    try:
        depth = limits.max_payload_depth
        check_json(output, f"workflow {workflow.name!r}", "output", depth)
    except PayloadError as exc:
        return replace(decision, run_status=RunStatus.FAILED, error=error_info(exc))
    return replace(decision, run_status=RunStatus.COMPLETED, output=output)
