"""Helpers for the store tests: recording steps, lapsing leases, racing threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from pikku_celery.store import (
    Decision,
    NewRun,
    NewStep,
    RunState,
    RunView,
    StepKind,
    StepState,
    StepStatus,
    WorkflowStore,
)
from tests.helpers import wait_until

TASK = "tasks.work"
LONG = 60_000  # a lease nobody outlives in a test
SHORT = 300  # a lease a test waits out (polling the store's clock)


def task(name: str, seq: int = 0, **kw: Any) -> NewStep:
    kw.setdefault("task_name", TASK)
    return NewStep(name=name, seq=seq, kind=StepKind.TASK, **kw)


def record(store: WorkflowStore, run_id: str, *steps: NewStep, **decision: Any) -> Decision:
    """One pass that records ``steps`` (and whatever else ``decision`` says)."""
    made = Decision(new_steps=list(steps), **decision)
    store.advance(run_id, None, lambda view: made)
    return made


def make_run(
    store: WorkflowStore, *steps: NewStep, workflow: str = "wf", **new: Any
) -> tuple[RunState, dict[str, StepState]]:
    run, _ = store.create_run(NewRun(workflow=workflow, input={"n": 1}, **new))
    if steps:
        record(store, run.id, *steps)
    by_name = {s.name: s for s in store.get_steps(run.id)}
    run = store.get_run(run.id) or run
    return run, by_name


def make_tasks(store: WorkflowStore, n: int, **kw: Any) -> tuple[RunState, list[StepState]]:
    run, steps = make_run(store, *[task(f"s{i}", i, **kw) for i in range(n)])
    return run, [steps[f"s{i}"] for i in range(n)]


def lapse(store: WorkflowStore, *steps: StepState, timeout: float = 10.0) -> None:
    """Wait (polling the store's own clock) until every lease given has lapsed."""
    deadline = max(s.lease_expires_at or 0 for s in steps)
    wait_until(lambda: store.now_ms() > deadline, timeout=timeout)


def claim(store: WorkflowStore, step: StepState, worker: str, lease: int = LONG) -> StepState:
    got = store.claim_step(step.id, step.task_name or TASK, worker, lease)
    assert got is not None, f"{worker} could not claim {step.name}"
    return got


def race(*fns: Callable[[], Any], timeout: float = 60.0) -> list[tuple[str, Any]]:
    """Run ``fns`` at once on real threads (released by one barrier).

    Returns ``("ok", value)`` or ``("err", exception)`` per function, in order.
    """
    barrier = threading.Barrier(len(fns))
    results: list[tuple[str, Any]] = [("missing", None)] * len(fns)

    def run(i: int, fn: Callable[[], Any]) -> None:
        barrier.wait(timeout)
        try:
            results[i] = ("ok", fn())
        except BaseException as exc:
            results[i] = ("err", exc)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread did not finish"
    return results


def settled_view(view: RunView) -> dict[str, StepStatus]:
    return {s.name: s.status for s in view.steps}


def names(steps: Sequence[StepState]) -> list[str]:
    return [s.name for s in steps]
