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
from ..errors import CorruptValueError, StepFailedError
from ..store.model import JSON
from .evaluate import PENDING, Done, Evaluator, Failed, Outcome
from .names import COUNTDOWN, ERRBACK_TASK, ROOT
from .plan import PLAN_VERSION, TAKEOVERS, Node


def run_canvas(ctx: Context, plan: dict[str, Any]) -> JSON:
    """The body of ``pikku.canvas``: interpret ``plan`` (see the module)."""
    if not isinstance(plan, dict) or plan.get("pikku_canvas") != PLAN_VERSION:
        raise CorruptValueError(
            f"run {ctx.run_id}: its input is not a version {PLAN_VERSION} canvas plan"
        )
    driver = _StepDriver(ctx)
    driver.reach_recorded()
    walk = Evaluator(driver)
    outcome = walk.run(plan["root"], ROOT, None)
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
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.reached: set[str] = set()

    def reach_recorded(self) -> None:
        """Reach every recorded step again, in order (timers that are due resolve)."""
        for name in self.ctx.recorded_names():
            self.reached.add(name)
            if name.endswith(COUNTDOWN):
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
        return Done(value)

    def step_id(self, path: str) -> str:
        return self.ctx.idempotency_key(path)

    def task(self, path: str, node: Node, args: list[Any], kwargs: dict[str, Any]) -> Outcome:
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
        )
        return PENDING

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
