"""Starting a durable canvas: checked whole, stored as one run, first pass taken."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import CanvasError
from ..names import check_name
from ..payload import dumps
from .handle import CanvasRun
from .names import WORKFLOW
from .plan import compile_plan
from .slices import most_per_run

if TYPE_CHECKING:
    from ..celery.integration import Pikku


def start(pikku: Pikku, signature: Any, idempotency_key: str | None = None) -> CanvasRun:
    """Check ``signature`` whole, store it as a run, take its first pass."""
    plan = compile_plan(pikku.app, signature)
    steps, slices = most_per_run(plan["root"])
    limit = pikku.limits.max_steps_per_run
    if steps > limit:
        raise CanvasError(
            f"a run of the canvas may record {steps} steps (its tasks, countdowns, errbacks "
            f"and slices of large groups), above the limit of {limit} a run may record "
            "(max_steps_per_run)"
        )
    children = pikku.limits.max_children_per_run
    if slices > children:
        raise CanvasError(
            f"the canvas's large groups would start {slices} child runs of their slices, "
            f"above the limit of {children} a run may start (max_children_per_run)"
        )
    if idempotency_key is not None:
        check_name(idempotency_key, "idempotency_key")
    dumps(plan, "durable canvas", "the canvas", pikku.max_input_bytes)
    workflow = pikku.registry.get(WORKFLOW)  # as the workflow itself: never refused
    run = pikku.start(workflow, plan, idempotency_key=idempotency_key)
    return CanvasRun(pikku, run.run_id)
