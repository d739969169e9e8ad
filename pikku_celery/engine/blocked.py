"""A run no body here may replay: asked again later, backing off.

The wake-up that brought the run to this worker is spent, and a run waiting
on a signal or a child run is never idle to the sweep, so without another
wake-up it would wait for good, even once a worker that has its workflow
(or its pinned version) is running. Each blocked pass sends one wake-up,
``sweep_backoff`` doubling with each blocked pass of the chain (its count
rides in the wake-up's reason), at most ``sweep_max_backoff`` and never past
the queue's longest countdown.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import WorkflowEngine

BLOCKED_REASON = "blocked"
_CHAIN = re.compile(rf"^{BLOCKED_REASON}#(\d{{1,4}})$")
MAX_DOUBLINGS = 20


def rewake_blocked(engine: WorkflowEngine, run_id: str, reason: str) -> None:
    """Send the run's next wake-up after a pass this worker could not take."""
    match = _CHAIN.match(reason)
    count = int(match.group(1)) + 1 if match else 0
    wait = engine.sweep_backoff * 2 ** min(count, MAX_DOUBLINGS)
    ceiling = min(
        engine.sweep_max_backoff, engine.dispatcher.max_countdown(engine.orchestration_queue)
    )
    engine.dispatcher.wake_run(
        run_id, countdown=min(wait, ceiling), reason=f"{BLOCKED_REASON}#{count}"
    )
