"""Held bodies: a run's body kept parked where it waits, resumed with the next view.

Replaying the body from the top on every pass makes step *k* cost O(k). A
body that stays on this worker process is instead run in its own greenlet:
when it waits, it parks (switches back to the pass) instead of unwinding,
and the next pass of its run on this thread resumes it over the newer view.
A run that another process advanced, a pass that did not land, a cancel or a
changed body drops it, and the run is replayed from the top, once, with
every check a replay makes.

A greenlet only switches on the thread that made it, so the cache is per
thread; it is bounded (``Limits.resume_max_bodies`` and ``resume_max_steps``,
least recently used first). An evicted body gets :class:`GreenletExit`
thrown in where it waits, so its ``finally`` blocks run as a replayed
body's do when its pass ends, and its run is just replayed next time.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from greenlet import GreenletExit, getcurrent, greenlet

from ..model.values import JSON, RunView
from .context import Context, Suspend
from .limits import Limits, PassBudgetSpent
from .parking import held as still_held
from .parking import hold, indexed, rebase

if TYPE_CHECKING:
    from .workflow import Workflow

log = logging.getLogger(__name__)

_PARKED = object()


class Body:
    """A workflow body run in its own greenlet, so it can wait without unwinding."""

    def __init__(self, workflow: Workflow[Any, Any], ctx: Context, input: JSON) -> None:
        self.workflow = workflow
        self.ctx = ctx
        self._greenlet = greenlet(lambda: workflow.run_body(ctx, input))
        hold(ctx, self._park)

    @property
    def run_id(self) -> str:
        """The run whose body this is."""
        return self.ctx.run_id

    @property
    def parked(self) -> bool:
        """Whether the body waits, alive, for its next pass."""
        return bool(self._greenlet) and still_held(self.ctx)

    def advance(self) -> JSON:
        """Run the body until it waits (:class:`Suspend`), returns or raises."""
        self._greenlet.parent = getcurrent()  # where its next wait comes back to
        # It sees the pass's context variables (a trace, a request), as a replay would.
        self._greenlet.gr_context = contextvars.copy_context()
        got = self._greenlet.switch()
        if got is _PARKED:
            raise Suspend
        return got

    def close(self) -> None:
        """End a parked body where it waits, running its ``finally`` blocks.

        Nothing decides on what it does then: a ``finally`` that waits
        ends it (as in a replay), one that raises is only logged."""
        hold(self.ctx, None)
        if self._greenlet:
            self._greenlet.parent = getcurrent()
            try:
                self._greenlet.throw(GreenletExit)
            except Suspend:
                pass
            except (Exception, PassBudgetSpent) as exc:  # its run replays: nothing to fail
                log.warning("run %s: a dropped body raised on its way out: %r", self.run_id, exc)

    def _park(self) -> None:
        parent = self._greenlet.parent
        assert parent is not None
        parent.switch(_PARKED)


class _Held(threading.local):
    """This thread's parked bodies by run id, least recently used first."""

    def __init__(self) -> None:
        self.bodies: OrderedDict[str, Body] = OrderedDict()
        self.steps = 0
        self.resumed = 0
        self.replayed = 0


_held = _Held()


def take(workflow: Workflow[Any, Any], view: RunView) -> Body | None:
    """The run's parked body moved onto ``view``, or None (then it replays)."""
    body = _held.bodies.pop(view.run.id, None)
    if body is not None:
        _held.steps -= indexed(body.ctx)
        if body.workflow is workflow and rebase(body.ctx, view):
            _held.resumed += 1
            return body
        body.close()
    _held.replayed += 1
    return None


def keep(run_id: str, body: Body, limits: Limits) -> None:
    """Hold a parked body for its run's next pass here, within the bounds."""
    if not body.parked:
        body.close()
        return
    _held.bodies[run_id] = body
    _held.steps += indexed(body.ctx)
    while _held.bodies and (
        len(_held.bodies) > limits.resume_max_bodies or _held.steps > limits.resume_max_steps
    ):
        _, oldest = _held.bodies.popitem(last=False)
        _held.steps -= indexed(oldest.ctx)
        oldest.close()


def forget(run_id: str) -> None:
    """Drop the run's parked body, if this thread holds one."""
    body = _held.bodies.pop(run_id, None)
    if body is not None:
        _held.steps -= indexed(body.ctx)
        body.close()


def release_all() -> None:
    """Drop every body this thread holds (a worker shutting down)."""
    while _held.bodies:
        forget(next(iter(_held.bodies)))


def holding() -> list[str]:
    """The runs whose bodies this thread holds, least recently used first."""
    return list(_held.bodies)


def passes() -> tuple[int, int]:
    """How many passes on this thread resumed a parked body, and how many replayed."""
    return _held.resumed, _held.replayed
