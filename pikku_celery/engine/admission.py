"""Admission: a run of a workflow with a concurrency key enters its key's slots.

A start creates the run queued and enters it (:func:`start_limited`); an
admitted run takes its first pass here; the sweep enters the queued runs a
crash left outside and frees the slots of runs that settled without leaving
(:func:`heal_slots`). Apart from :mod:`.concurrency` because admission takes
a pass (:mod:`.orchestrate`), and a settling pass leaves its slot there.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import IdempotencyKeyReusedError
from ..model.slots import ConcurrencySlots
from ..model.values import JSON, NewRun, RunStatus
from .concurrency import Concurrency, cancel_holder, concurrency_of, slots_of
from .handle import RunHandle
from .orchestrate import advance
from .outage import ride_out

if TYPE_CHECKING:
    from .core import WorkflowEngine
    from .observe import RunStart
    from .workflow import Workflow

# Its warnings under the concurrency logger's name, where they always were.
log = logging.getLogger("pikku_celery.engine.concurrency")


def start_limited(
    engine: WorkflowEngine,
    wf: Workflow[Any, Any],
    concurrency: Concurrency,
    new: NewRun,
    input_json: JSON,
    starting: RunStart,
) -> RunHandle[Any]:
    """``start`` of a workflow with a concurrency key: the run is created
    queued, then enters its key (and, admitted, takes its first pass)."""
    key = concurrency.key_for(wf.name, new.input)  # refused before anything is written
    slots = slots_of(engine)
    queued = replace(new, status=RunStatus.QUEUED)
    run, created = ride_out(
        engine, lambda: engine.store.create_run(queued), f"starting workflow {wf.name!r}"
    )
    created = created or run.id == new.id
    starting.created(run, created)
    if created:
        enter(engine, slots, run.id, key, concurrency)
    elif new.idempotency_key is not None and run.input != input_json:
        raise IdempotencyKeyReusedError(wf.name, new.idempotency_key, run.id)
    return RunHandle(engine, run.id)


def enter(
    engine: WorkflowEngine,
    slots: ConcurrencySlots,
    run_id: str,
    key: str,
    concurrency: Concurrency,
) -> None:
    """Enter the queued run on ``key``, cancel what the entry displaces, and
    take the first pass of an admitted run."""
    entry = ride_out(
        engine,
        lambda: slots.enter_slot(run_id, key, concurrency.limit, concurrency.on_limit),
        f"entering run {run_id} on concurrency key {key!r}",
    )
    for holder in entry.to_cancel:
        cancel_holder(engine, holder, run_id)
    for admitted in entry.promoted:
        engine.dispatcher.wake_run(admitted, reason="admitted")
    if entry.admitted:
        ride_out(
            engine,
            lambda: advance(engine, run_id, None, reason="start"),
            f"the first pass of run {run_id}",
        )


def heal_slots(engine: WorkflowEngine, limit: int, older_than_ms: int) -> int:
    """The sweep's part: free the slots of runs that settled with no exit
    (their worker died after the settling commit), enter the queued runs
    whose start stopped before their entry, and wake the runs admitted.
    Returns how many runs it admitted or entered."""
    slots = engine.capabilities.slots
    if slots is None:
        return 0
    healed = 0
    for run_id in slots.stale_slots(limit):
        for admitted in slots.leave_slot(run_id):
            engine.dispatcher.wake_run(admitted, reason="admitted")
            healed += 1
    for run in slots.unslotted_runs(older_than_ms, limit):
        concurrency = concurrency_of(engine, run.workflow)
        if concurrency is None:
            continue  # a worker that knows its workflow enters it
        try:
            key = concurrency.key_for(run.workflow, run.input)
        except Exception as exc:
            log.warning("queued run %s: no concurrency key: %s", run.id, exc)
            continue
        enter(engine, slots, run.id, key, concurrency)
        healed += 1
    return healed
