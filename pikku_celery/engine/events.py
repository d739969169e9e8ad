"""Reading a run's progress events from outside it: all of them, or one key's
latest value, waiting for it to be set.

Events are value steps; a reader reads those steps alone
(``WorkflowStore.event_steps``), not the run's whole history. A waiter polls
from a millisecond, backing off to :data:`MAX_POLL`, and gives up when the run
ends without the key or its timeout passes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..errors import EventNotSetError, EventTimeoutError, RunNotFoundError
from ..names import MAX_EVENT_KEY_LENGTH, check_name
from ..store.events import RunEvent, events_of, latest_event
from .outage import ride_out

if TYPE_CHECKING:
    from .core import WorkflowEngine

MAX_POLL = 0.05
"""The longest pause between two reads of a waiter (seconds)."""


def run_events(
    engine: WorkflowEngine, run_id: str, within: float | None = None, key: str | None = None
) -> list[RunEvent]:
    """Every event the run has set (of ``key``, or of every key), in order;
    riding out an outage for ``within`` seconds (None: the engine's
    ``outage_timeout``)."""
    if key is not None:  # a key no run could have set is refused before any read
        check_name(key, "event key", MAX_EVENT_KEY_LENGTH)
    store = engine.store
    what = f"reading the events of run {run_id}"
    steps = ride_out(engine, lambda: store.event_steps(run_id, key), what, within)
    if not steps and ride_out(engine, lambda: store.get_run(run_id), what, within) is None:
        raise RunNotFoundError(f"no workflow run {run_id!r}")
    return events_of(steps)


def wait_for_event(
    engine: WorkflowEngine, run_id: str, key: str, timeout: float | None
) -> RunEvent:
    """The latest event ``key`` of the run, waiting up to ``timeout`` seconds
    (None: until it is set or the run ends) for a first one."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while True:
        within = None if deadline is None else deadline - time.monotonic()
        found = latest_event(run_events(engine, run_id, within, key), key)
        if found is not None:
            return found
        within = None if deadline is None else deadline - time.monotonic()
        what = f"reading run {run_id}"
        run = ride_out(engine, lambda: engine.store.get_run(run_id), what, within)
        if run is None:
            raise RunNotFoundError(f"no workflow run {run_id!r}")
        if run.status.terminal:
            # The run set it between the two reads, or never will.
            found = latest_event(run_events(engine, run_id, within, key), key)
            if found is not None:
                return found
            raise EventNotSetError(run_id, key, f"the run ended {run.status} without setting it")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise EventTimeoutError(run_id, key, f"not set within {timeout} s")
        time.sleep(delay if left is None else min(delay, left))
        delay = min(delay * 1.5, MAX_POLL)
