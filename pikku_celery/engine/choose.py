"""Which registered body replays a run: its own version, or the newest that fits.

Used by the orchestration pass and by the deploy check alike, so the check
replays every run on the very body a worker with the same code would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model.values import Decision, RunView
from .replay import replay
from .versions import candidates, diverged, first_replaying
from .workflow import Workflow

if TYPE_CHECKING:
    from .core import WorkflowEngine


def bodies_for(engine: WorkflowEngine, view: RunView) -> list[Workflow[Any, Any]]:
    """The bodies that may replay the run (see :func:`.versions.candidates`)."""
    return candidates(engine.registry, view.run)


def replay_on(
    engine: WorkflowEngine, bodies: list[Workflow[Any, Any]], view: RunView
) -> tuple[Workflow[Any, Any], Decision]:
    """The pass's decision on the first of ``bodies`` whose replay does not
    diverge from the run's history (the first body's if all do)."""

    def attempt(wf: Workflow[Any, Any]) -> Decision:
        return replay(
            wf,
            view,
            engine.dispatcher.task_name,
            engine.dispatcher.task_queue,
            engine.registry.get,
            engine.limits,
        )

    if len(bodies) == 1:
        return bodies[0], attempt(bodies[0])
    return first_replaying(bodies, attempt, diverged)
