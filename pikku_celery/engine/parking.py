"""A parked body's context: what a resumed body keeps between passes, and
how it is moved onto a newer view (:mod:`.resume` holds the bodies).

What persists with the body's position: the pass record's reached steps,
patch answers, event counters and now# count, and the index of recorded
steps. What one pass produces: its decision and its wakes, renewed per pass.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import CorruptValueError
from ..model.values import Decision, RunView, StepKind, StepState, StepStatus
from .pass_record import Suspend
from .readable import check_steps, check_values

if TYPE_CHECKING:
    from .context import Context


# What persists with the body's position: ``_pass``'s reached steps, patch
# answers, event counters and now# count, and the index of recorded steps.
# What one pass produces: ``_pass.decision`` and its wakes, renewed per pass.


_Method = TypeVar("_Method", bound=Callable[..., Any])


def waits(method: _Method) -> _Method:
    """A call that may wait: replayed, it ends the pass (:class:`Suspend`);
    held (see :mod:`.resume`), it parks the body and, once resumed over a
    newer view, makes the call again from where it began."""

    @functools.wraps(method)
    def waiting(self: Context, *args: Any, **kwargs: Any) -> Any:
        self._again = False
        while True:
            mark = len(self._pass.reached)
            try:
                return method(self, *args, **kwargs)
            except Suspend:
                if self._park is None:
                    raise
                rewind(self, mark)
                self._park()
                self._again = True  # the same call, over the view rebase() moved it to

    return waiting  # type: ignore[return-value]


def hold(ctx: Context, park: Callable[[], None] | None) -> None:
    """Let ``ctx``'s waits park the body with ``park`` instead of ending it
    (None: end it, as a replay does)."""
    ctx._park = park


def held(ctx: Context) -> bool:
    """Whether ``ctx`` still parks its waits (a body may pin itself to replay)."""
    return ctx._park is not None


def indexed(ctx: Context) -> int:
    """How many recorded steps ``ctx`` indexes: the measure of what it holds."""
    return len(ctx._recorded)


def rewind(ctx: Context, mark: int) -> None:
    """Forget the steps a waiting call reached, so it can reach them again."""
    reached = ctx._pass.reached
    while len(reached) > mark:
        name, _ = reached.popitem()
        if name.startswith("now#"):
            ctx._pass.now_reached -= 1


def rebase(ctx: Context, view: RunView) -> bool:
    """Move a parked body's context onto ``view`` for its next pass.

    True only when ``view`` extends what the body holds: the steps it
    indexed, then exactly the steps its last pass recorded, with every step
    it settled itself settled. Only the steps that may have changed (in
    flight, or new) are read, so the cost follows what changed, not the
    run's length. False: the body must be dropped and the run replayed.
    """
    steps = view.steps
    last = ctx._pass.decision
    recorded = ctx._recorded
    known = len(recorded)
    if view.run.id != ctx.run_id or len(steps) != known + len(last.new_steps):
        return False
    by_name = ctx._by_name
    for new in last.new_steps:
        step = steps[new.seq]
        if step.seq != new.seq or step.name != new.name or new.seq != len(recorded):
            return False
        recorded.append(step)
        by_name[step.name] = step
        still_open(ctx, step)
    changed = steps[known:]
    for seq in list(ctx._open):
        step, held = steps[seq], recorded[seq]
        if step is held:
            continue  # the view kept it: unchanged
        if step.seq != seq or step.name != held.name:
            return False
        recorded[seq] = by_name[step.name] = step
        if watched_state(step) != watched_state(held):
            changed.append(step)
            still_open(ctx, step)
    # What each waiting task step's step_async does on a replay.
    decision = Decision(redispatch=[recorded[seq].id for seq in sorted(ctx._retrying)])
    if any(not by_name[name].settled for name in ctx._settled_now):
        return False  # a resolution of its last pass did not land
    try:
        check_values(view.signals.values())
        check_steps(changed)
        if view.reread:  # an operator may have edited a value: checked as a replay would
            check_steps(s for s in steps[:known] if s.settled)
    except CorruptValueError:
        return False  # a replay refuses it, naming the value
    ctx._view = view
    ctx._changed = {step.name for step in changed}
    ctx._settled_now = {}
    ctx._pass.decision = decision
    ctx._pass.in_flight_wakes = []
    ctx._calls = 0
    ctx._deadline = time.monotonic() + ctx._limits.pass_max_seconds
    return True


def still_open(ctx: Context, step: StepState) -> None:
    """Index ``step`` as in flight (and as waiting for its retry) or not."""
    if step.settled:
        ctx._open.discard(step.seq)
    else:
        ctx._open.add(step.seq)
    if not step.settled and step.kind == StepKind.TASK and awaits_retry(step):
        ctx._retrying.add(step.seq)
    else:
        ctx._retrying.discard(step.seq)


def watched_state(step: StepState) -> tuple[object, ...]:
    """What of a step a body can see change while it waits on it."""
    return (step.status, step.attempt, step.wake_at, step.scheduled_at, step.updated_at)


def awaits_retry(step: StepState) -> bool:
    """A failed step waiting for its next attempt, whose message is not sent yet."""
    return (
        step.status == StepStatus.FAILED and step.wake_at is not None and step.scheduled_at is None
    )
