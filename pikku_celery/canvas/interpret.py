"""The built-in ``pikku.canvas`` workflow: a stored plan, run node by node as steps.

Each pass reaches the steps the run already recorded in their recorded order
(so replay stays deterministic while branches finish in any order), then
walks the plan and starts every node whose inputs are now known. Every node is
an ordinary step: claim, lease from its queue, attempt fencing, retries,
sweep. The run ends once nothing is in flight (errbacks and links included):
with the root's result, or failed with the error Celery would raise.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..engine.context import Context, StepHandle, Suspend
from ..engine.replacement import SUFFIX as REPLACED_SUFFIX
from ..errors import CorruptValueError, StepFailedError
from ..model.values import JSON, step_id_for
from .added import SUFFIX as ADDED_SUFFIX
from .added import additions
from .evaluate import PENDING, Done, Evaluator, Failed, Outcome
from .lineage import CALLER, Lineage
from .names import COUNTDOWN, ERRBACK_TASK, FAIL_UNRUN_TASK, ROOT, WORKFLOW
from .plan import PLAN_VERSION, TAKEOVERS, Node
from .slices import SUFFIX as SLICE_SUFFIX
from .slices import joined_slices, slice_outcome, slice_plans


def run_canvas(ctx: Context, plan: dict[str, Any]) -> JSON:
    """The body of ``pikku.canvas``: interpret ``plan`` (see the module)."""
    if not isinstance(plan, dict) or plan.get("pikku_canvas") != PLAN_VERSION:
        raise CorruptValueError(
            f"run {ctx.run_id}: its input is not a version {PLAN_VERSION} canvas plan"
        )
    # A slice of a large group (:mod:`.slices`) runs under the group's path,
    # fed what the group is fed, its task ids those of the canvas's own run.
    driver = _StepDriver(ctx, str(plan.get("ids") or ctx.run_id))
    driver.reach_recorded()
    walk = Evaluator(driver)
    lineage = plan.get("lineage") or CALLER
    outcome = walk.run(
        plan["root"], str(plan.get("path") or ROOT), plan.get("prepend"), tuple(lineage)
    )
    if walk.busy or isinstance(outcome, type(PENDING)):
        raise Suspend
    if isinstance(outcome, Failed):
        err = outcome.error
        raise StepFailedError(
            outcome.step,
            str(err.get("type", "Error")),
            str(err.get("message", "")),
            str(err.get("traceback", "")),
        )
    assert isinstance(outcome, Done)
    return outcome.value


class _StepDriver:
    def __init__(self, ctx: Context, ids: str) -> None:
        self.ctx = ctx
        self.ids = ids
        self.reached: set[str] = set()
        self.added: dict[str, list[Any]] = {}

    def reach_recorded(self) -> None:
        """Reach every recorded step again, in order (timers that are due resolve)."""
        for name in self.ctx.recorded_names():
            self.reached.add(name)
            if name.endswith(REPLACED_SUFFIX) or ADDED_SUFFIX in name or SLICE_SUFFIX in name:
                self.ctx.child_async(name, WORKFLOW)  # a task's replacement (self.replace)
            elif name.endswith(COUNTDOWN):
                with contextlib.suppress(Suspend):  # a timer not yet due waits
                    self.ctx.sleep(name, 0)
            else:
                self.ctx.step_async(name, None)  # recorded: only reached (or re-sent)

    def state(self, name: str) -> Outcome:
        try:
            (value,) = self.ctx.gather(StepHandle(name), return_exceptions=True)
        except Suspend:
            return PENDING
        if isinstance(value, StepFailedError):
            error = {"type": value.error_type, "message": value.message}
            return Failed(name, {**error, "traceback": value.traceback})
        value, plans = additions(value)
        if plans:
            self.added[name] = plans
        return Done(value)

    def added_to_chord(self, path: str) -> list[Outcome]:
        """The outcomes of what the task at ``path`` added to its chord
        (``self.add_to_chord``), each a child canvas run."""
        outcomes: list[Outcome] = []
        for k, plan in enumerate(self.added.get(path, [])):
            name = f"{path}{ADDED_SUFFIX}{k}"
            if name not in self.reached:
                self.reached.add(name)
                self.ctx.child_async(name, WORKFLOW, plan)
            outcomes.append(self.state(name))
        return outcomes

    def additions_outside_a_chord(self, path: str) -> bool:
        """Whether the task at ``path`` called ``add_to_chord`` (it was no header member)."""
        return bool(self.added.get(path))

    def slices(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        outcomes: list[Outcome] = []
        for k, plan in enumerate(slice_plans(node, path, prepend, self.ids, lineage)):
            name = f"{path}{SLICE_SUFFIX}{k}"
            if name not in self.reached:
                self.reached.add(name)
                self.ctx.child_async(name, WORKFLOW, plan)
            outcomes.append(slice_outcome(self.state(name)))
        return joined_slices(outcomes)

    def step_id(self, path: str) -> str:
        return step_id_for(self.ids, path)

    def task(
        self,
        path: str,
        node: Node,
        args: list[Any],
        kwargs: dict[str, Any],
        extras: dict[str, Any],
    ) -> Outcome:
        countdown = node.get("countdown")
        if countdown:
            timer = path + COUNTDOWN
            if timer not in self.reached:
                self.reached.add(timer)
                try:
                    self.ctx.sleep(timer, countdown)  # a durable timer, not a broker ETA
                except Suspend:
                    return PENDING
            elif not isinstance(self.state(timer), Done):
                return PENDING
        if path in self.reached:
            return self.state(path)
        self.reached.add(path)
        route = node["route"]
        self.ctx.task_async(
            path,
            node["task"],
            args,
            kwargs,
            retries=node["attempts"] - 1,
            retry_delay=node["retry_delay"],
            backoff=1.0,
            queue=route.get("queue"),
            exchange=route.get("exchange"),
            routing_key=route.get("routing_key"),
            priority=route.get("priority"),
            task_id=node.get("id") or self.step_id(path),
            time_limits=(route.get("time_limit"), route.get("soft_time_limit")),
            delayed=bool(countdown),
            extras=extras,
        )
        return PENDING

    def fail_unrun(self, path: str, ids: list[str], failed: Failed) -> bool:
        if path in self.reached:
            return not isinstance(self.state(path), type(PENDING))
        self.reached.add(path)
        self.ctx.task_async(path, FAIL_UNRUN_TASK, [ids, failed.error], {}, retries=TAKEOVERS)
        return False

    def errback(self, path: str, errback: Node, failed: Failed, request: dict[str, Any]) -> bool:
        if path in self.reached:
            return not isinstance(self.state(path), type(PENDING))
        self.reached.add(path)
        if errback["new_style"]:
            signature = {k: errback[k] for k in ("task", "args", "kwargs", "immutable")}
            self.ctx.task_async(
                path,
                ERRBACK_TASK,
                [signature, {**request, "error": failed.error}],
                {},
                retries=TAKEOVERS,
            )
        else:
            # Celery sends an old-style errback the failed task's id.
            args = errback["args"] if errback["immutable"] else [request["id"], *errback["args"]]
            self.ctx.task_async(path, errback["task"], args, errback["kwargs"], retries=TAKEOVERS)
        return False
