"""Starting a run: its input checked, its row created, its first pass taken.

What :meth:`WorkflowEngine.start <pikku_celery.engine.core.WorkflowEngine.start>`
does, kept apart from the engine's registry and settings so the start path
reads on its own (a keyed start, a limited workflow, an outage ridden out).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..errors import IdempotencyKeyReusedError, UnknownWorkflowError
from ..model.values import JSON, NewRun, RunState
from ..names import check_name
from .admission import start_limited
from .deadline import run_timeout_ms
from .handle import RunHandle
from .orchestrate import advance
from .outage import ride_out
from .workflow import Workflow

if TYPE_CHECKING:
    from .core import WorkflowEngine


def start_run(
    engine: WorkflowEngine,
    workflow: str | Workflow[Any, Any],
    input: JSON,
    idempotency_key: str | None,
    timeout: float | timedelta | None,
) -> RunHandle[Any]:
    """Record a new run of ``workflow`` and take its first pass (see
    :meth:`WorkflowEngine.start`, which documents the arguments)."""
    wf = engine.registry.get(workflow)
    timeout_ms = wf.timeout_ms if timeout is None else run_timeout_ms(timeout)
    if isinstance(workflow, str) and not wf.by_name:
        raise UnknownWorkflowError(
            f"workflow {wf.name!r} cannot be started by its name: {wf.by_name_refusal}"
        )
    if idempotency_key is not None:
        check_name(idempotency_key, "idempotency_key")
    text = engine.check_input(input, f"workflow {wf.name!r}", "input")
    with engine.observers.starting(wf.name) as starting:
        new = NewRun(
            workflow=wf.name,
            input=input,
            idempotency_key=idempotency_key,
            trace_context=starting.trace_context,
            workflow_version=wf.version,
            timeout_ms=timeout_ms,
        )
        if wf.concurrency is not None:
            return start_limited(engine, wf, wf.concurrency, new, json.loads(text), starting)
        if idempotency_key is None:
            # Created by its first pass: in one write where the store can.
            began = time.monotonic()
            tries: list[int] = []
            created_run = ride_out(
                engine, lambda: first_pass(engine, new, tries), f"starting workflow {wf.name!r}"
            )
            if created_run is not None:
                starting.created(created_run, True)
            return RunHandle(engine, new.id, started_at=began)
        run, created = ride_out(
            engine, lambda: engine.store.create_run(new), f"starting workflow {wf.name!r}"
        )
        # The run the key names is this call's own when a try the outage
        # cut off had stored it after all: it still needs its first pass.
        created = created or run.id == new.id
        starting.created(run, created)
        if created:
            ride_out(
                engine,
                lambda: advance(engine, run.id, None, reason="start"),
                f"the first pass of run {run.id}",
            )
    if not created and idempotency_key is not None and run.input != json.loads(text):
        raise IdempotencyKeyReusedError(wf.name, idempotency_key, run.id)
    return RunHandle(engine, run.id)


def first_pass(engine: WorkflowEngine, new: NewRun, tries: list[int]) -> RunState | None:
    """The pass that creates ``new``, the run it made (None: superseded).

    Taken again after an outage (``tries`` counts them). When the try the
    outage cut off had stored the run after all (a connection lost while
    its commit was on the way), the pass is taken on the stored run: a
    pass decides nothing twice, and the sweep sends any message that
    try had not sent yet."""
    stored = engine.store.get_run(new.id) if tries else None
    tries.append(1)
    passed = advance(engine, new.id, None, reason="start", start=None if stored else new)
    return passed.run if passed is not None else stored
