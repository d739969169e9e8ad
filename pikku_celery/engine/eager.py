"""Eager steps: the next step of a run runs where the step before it finished.

The pass that records a step's outcome may write the run's next step already
claimed by the worker that passes (DESIGN.md, "The hot path"), which then
runs it in the same task call: no broker hop and no separate claim. This
module decides which step, and for how long one message may go on so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..model.changes import new_claim_id
from ..model.values import (
    Decision,
    Delivery,
    EagerClaim,
    NewStep,
    StepKind,
    StepState,
    StepStatus,
)
from .dispatcher import EagerDispatch

if TYPE_CHECKING:
    from .core import WorkflowEngine

StepBody = Callable[[StepState], Any]

# A message may run this many of its run's steps eagerly, for at most this
# long (docs/guide/concepts.md, "Eager steps", says why these defaults).
EAGER_MAX_STEPS = 50
EAGER_MAX_SECONDS = 10.0


@dataclass
class EagerBudget:
    """What the message that carries a run may still run eagerly.

    The message stays unacknowledged until its task call returns, so the
    budget keeps the call well inside the queue's redelivery horizon, and
    hands the run back to the broker now and then so that one long run does
    not keep a worker process from the messages waiting behind it.
    """

    steps_left: int
    deadline: float  # on time.monotonic()

    @classmethod
    def for_message(cls, max_steps: int, max_seconds: float) -> EagerBudget:
        """The budget of a message received now."""
        return cls(max_steps, time.monotonic() + max_seconds)

    def spent(self) -> bool:
        """No more eager steps for this message."""
        return self.steps_left <= 0 or time.monotonic() >= self.deadline

    def take(self) -> None:
        """One eager step is on its way."""
        self.steps_left -= 1


def eligible(new: NewStep) -> bool:
    """Whether a new step can be claimed at once: a task step due now."""
    return (
        new.eager
        and new.kind == StepKind.TASK
        and new.status == StepStatus.SCHEDULED
        and new.wake_at is None
        and new.child is None
        and new.task_name is not None
    )


class EagerOffer:
    """This worker's offer, for one pass, to run one of its new steps itself."""

    def __init__(
        self,
        dispatch: EagerDispatch,
        worker: str,
        carrier: StepBody,
        lease_ms: Callable[[str | None], int],
        delivery: Delivery | None = None,
    ) -> None:
        self._delivery = delivery
        self._dispatch = dispatch
        self._worker = worker
        self._carrier = carrier
        self._lease_ms = lease_ms
        self.body: StepBody | None = None  # the chosen step's body

    def choose(self, decision: Decision) -> Decision:
        """``decision`` naming in ``eager`` the first new step this process
        can run now; of a fan-out, only that one (the rest are published)."""
        self.body = None
        for new in decision.new_steps:
            if not eligible(new):
                continue
            assert new.task_name is not None
            body = self._dispatch.eager_body(new.task_name, new.queue, self._carrier)
            if body is None:
                continue
            claim = EagerClaim(
                new.name, self._worker, self._lease_ms(new.queue), new_claim_id(), self._delivery
            )
            self.body = body
            return replace(decision, eager=claim)
        return replace(decision, eager=None) if decision.eager is not None else decision


def eager_offer(
    engine: WorkflowEngine,
    budget: EagerBudget | None,
    carrier: StepBody,
    delivery: Delivery | None = None,
) -> EagerOffer | None:
    """An offer for the next pass, if the engine's dispatcher can run steps
    here and the message's budget is not spent; the eager attempt's row
    names the carrying message (``delivery``)."""
    dispatch = engine.eager_dispatch
    if budget is None or dispatch is None or budget.spent():
        return None
    return EagerOffer(dispatch, engine.worker_id, carrier, engine.dispatcher.lease_ms, delivery)
