"""Concurrency per key: at most ``limit`` running runs of a workflow per key.

A run of such a workflow is created ``queued``, then enters its key's slots
(:mod:`pikku_celery.model.slots`): admitted, it becomes ``running`` in the
same write and takes its first pass; otherwise it waits (``queue``), ends
cancelled (``cancel_newest``), or asks the runs holding the key to cancel
and waits for them (``cancel_in_progress``). The pass that settles a holder
leaves its slot, which admits the oldest waiting run in the same write. The
sweep heals what a crash left between those writes. Entering a key, which
takes a pass, is :mod:`.admission`'s; this module is what a pass needs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import StoreError
from ..model.slots import ON_LIMIT, ConcurrencySlots, OnLimit
from ..model.values import JSON, AuditAction, Operator, RunState
from ..store.rules import run_cancelled_error

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

MAX_KEY_LENGTH = 255
CONCURRENCY_OPERATOR = Operator("concurrency")
"""Who cancels a run for a newer start on its key (``cancel_in_progress``)."""


@dataclass(frozen=True)
class Concurrency:
    """``@pikku.workflow(concurrency=Concurrency(key=..., limit=N, on_limit=...))``.

    ``key(input)`` names the group a run belongs to (a customer, a tenant, a
    document); at most ``limit`` runs of the workflow run at once per key.
    ``on_limit`` says what a start does when they all run: ``"queue"`` (wait,
    in start order), ``"cancel_in_progress"`` (the newest start wins: the
    running ones are cancelled, the waiting ones end) or ``"cancel_newest"``
    (the new run ends cancelled).
    """

    key: Callable[[Any], object]
    limit: int = 1
    on_limit: OnLimit = "queue"

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise TypeError(f"Concurrency(key=) takes a function of the input, not {self.key!r}")
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValueError(f"Concurrency(limit=) must be an int of 1 or more, not {self.limit!r}")
        if self.on_limit not in ON_LIMIT:
            raise ValueError(
                f"Concurrency(on_limit=) must be one of {', '.join(ON_LIMIT)}, "
                f"not {self.on_limit!r}"
            )

    def key_for(self, workflow: str, input: JSON) -> str:
        """The stored key of a run of ``workflow`` with ``input``: the
        workflow's name and ``key(input)``, so two workflows never share slots."""
        value = self.key(input)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            raise ValueError(
                f"the concurrency key of workflow {workflow!r} must be a non-empty str or an "
                f"int, not {value!r}"
            )
        key = f"{workflow}:{value}"
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(
                f"the concurrency key {key[:60]!r}... of workflow {workflow!r} is longer than "
                f"{MAX_KEY_LENGTH} characters"
            )
        return key


def slots_of(engine: WorkflowEngine) -> ConcurrencySlots:
    """The engine's store's slots; a store without them refuses such workflows."""
    slots = engine.capabilities.slots
    if slots is None:
        raise StoreError(
            f"{type(engine.store).__name__} keeps no concurrency slots: a workflow with "
            "concurrency= needs the memory or the SQL store"
        )
    return slots


def cancel_holder(engine: WorkflowEngine, run_id: str, newer: str) -> None:
    """Ask a running run to cancel for a newer start on its key."""
    store = engine.store
    try:
        run = store.request_cancel(run_id)
        if not run.status.terminal:
            store.record_action(
                run_id, AuditAction.CANCEL, CONCURRENCY_OPERATOR, {"newer_run": newer}
            )
            engine.dispatcher.wake_run(run_id, reason="cancel")
    except Exception as exc:  # the holder settles anyway; the newer run waits for it
        log.warning("could not cancel run %s for the newer run %s: %s", run_id, newer, exc)


def concurrency_of(engine: WorkflowEngine, workflow: str) -> Concurrency | None:
    """The concurrency of a workflow this worker knows (None: none, or unknown)."""
    registry = engine.registry
    if not registry.known(workflow):
        return None
    return registry.get(workflow).concurrency


def left(engine: WorkflowEngine, run: RunState) -> None:
    """The pass that settled ``run`` is committed: give its slot to the next
    waiting run and wake it. A failure here is healed by the sweep."""
    if concurrency_of(engine, run.workflow) is None:
        return
    try:
        admitted = slots_of(engine).leave_slot(run.id)
    except Exception as exc:
        log.warning("run %s settled; the sweep will free its concurrency slot: %s", run.id, exc)
        return
    for run_id in admitted:
        engine.dispatcher.wake_run(run_id, reason="admitted")


def queued_wakeup(engine: WorkflowEngine, run: RunState) -> None:
    """A message for a queued run: it runs nothing until admitted, but a
    cancel asked of it ends it now."""
    if not run.cancel_requested:
        return
    if not slots_of(engine).cancel_queued(run.id, run_cancelled_error()):
        engine.dispatcher.wake_run(run.id, reason="cancel")  # admitted meanwhile
