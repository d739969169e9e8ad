"""``ctx.continue_as_new``: end a run and start its successor in the same write.

A run that loops for ever (a poller, a batch over an endless feed) records
steps without end; its history, and what a replay of it costs, would grow
with it. Temporal's answer, kept here under its name: the body ends its run
and hands a fresh input to a new run of the same workflow, which starts with
an empty history.

The ending run completes (status ``completed``, output None) with
``continued_as`` naming its successor; the successor's ``continued_from``
names it back. Both rows, and the successor's first wake-up, come from the
one pass that ends the predecessor: written in one transaction, pinned to
the run's version, so a redelivered or repeated pass (a worker killed after
the commit, a message delivered twice) finds the run ended and starts
nothing. The successor's id and idempotency key are made from its
predecessor's id, so even a second write could not make a second run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import WorkflowError
from ..model.values import JSON, NewRun, RunState, uuid5_str
from ..payload import check_json

if TYPE_CHECKING:
    from .workflow import Workflow

SUCCESSOR_NAME = "continue_as_new"
"""The name a successor's id is made from, under its predecessor's id."""

KEY_PREFIX = "continued-from:"
"""A successor's idempotency key: this, then its predecessor's id."""


class ContinueAsNew(BaseException):
    """Ends the pass: the run completes and ``successor`` starts in its place.

    A BaseException, like the pass's suspension, so a body's ``except
    Exception`` cannot swallow it."""

    def __init__(self, successor: NewRun) -> None:
        super().__init__(f"continue as new: run {successor.id}")
        self.successor = successor


def successor_id(run_id: str) -> str:
    """The id of the run ``run_id`` continues as: the same on every replay."""
    return uuid5_str(run_id, SUCCESSOR_NAME)


def continuation(
    run: RunState, workflow: Workflow[Any, Any], input: JSON, max_depth: int
) -> ContinueAsNew:
    """What ``ctx.continue_as_new`` raises for ``run``: its successor, a run
    of ``workflow`` (its newest version) on ``input``; refused, with a
    :class:`WorkflowError` the body may catch, where a successor cannot
    stand in for the run."""
    if run.parent_run_id is not None:
        raise WorkflowError(
            f"run {run.id} is a child run: continue_as_new is for runs started by start() "
            "(its parent waits on this run's own output)"
        )
    if workflow.concurrency is not None:
        raise WorkflowError(
            f"workflow {workflow.name!r} has a concurrency limit: continue_as_new would "
            "start its successor outside the queue of its slots"
        )
    check_json(input, f"continue_as_new of run {run.id}", "input", max_depth)
    successor = NewRun(
        workflow=workflow.name,
        input=input,
        id=successor_id(run.id),
        idempotency_key=KEY_PREFIX + run.id,
        workflow_version=workflow.version,
        trace_context=run.trace_context,
        timeout_ms=workflow.timeout_ms,
        continued_from=run.id,
    )
    return ContinueAsNew(successor)
