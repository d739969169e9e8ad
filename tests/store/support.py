"""Helpers for the store tests: recording steps, lapsing leases, racing threads."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from pikku_celery.engine.known_runs import KnownRuns
from pikku_celery.engine.passes import created, start_pass, take_pass
from pikku_celery.model.plan import Landed, PassView
from pikku_celery.ports.store import Decide, RunStarts
from pikku_celery.store import (
    Decision,
    NewRun,
    NewStep,
    RunState,
    RunView,
    StepKind,
    StepOutcome,
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
    threaded(store).take_pass(run_id, None, lambda view: made)
    return made


def make_run(
    store: WorkflowStore, *steps: NewStep, workflow: str = "wf", **new: Any
) -> tuple[RunState, dict[str, StepState]]:
    run = threaded(store).create(NewRun(workflow=workflow, input={"n": 1}, **new))
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
    got = threaded(store).claim(step.id, step.task_name or TASK, worker, lease, run_id=step.run_id)
    assert got is not None, f"{worker} could not claim {step.name}"
    return got


class Threaded:
    """A store's calls with what the engine threads between them: a claim's
    view to its attempt's pass, an eager claim's to its pass, and what a
    pass left to the claim of the step it published."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self.runs = KnownRuns()
        self.views: dict[tuple[str, int], PassView | None] = {}
        self.created: dict[str, PassView | None] = {}

    def create(self, new: NewRun) -> RunState:
        """``create_run`` as the engine's start calls it: the run as created
        is its first pass's view."""
        view = created(self.store, new, self.runs)
        run = view.view.run if view is not None else self.store.get_run(new.id)
        assert run is not None
        self.created[run.id] = view
        return run

    def claim(
        self, step_id: str, task_name: str, worker: str, lease_ms: int, **kw: Any
    ) -> StepState | None:
        """``claim`` as the engine calls it: its view kept for the attempt's pass."""
        known = self.runs.take(step_id)
        got = self.store.claim(step_id, task_name, worker, lease_ms, known=known, **kw)
        if got is None:
            return None
        self.views[(got.step.id, got.step.attempt)] = got.view
        return got.step

    def take_pass(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> Landed | Any:
        """``take_pass`` handed the view of ``outcome``'s claim."""
        if outcome is None:
            known = self.created.pop(run_id, None)
        else:
            known = self.views.pop((outcome.step_id, outcome.attempt), None)
        return self._keep(take_pass(self.store, run_id, outcome, decide, known, self.runs))

    def start_pass(self, new: NewRun, decide: Decide) -> Any:
        """``start_pass`` as the engine's start takes it."""
        starts = self.store if isinstance(self.store, RunStarts) else None
        return self._keep(start_pass(self.store, starts, new, decide, self.runs))

    def _keep(self, done: Any) -> Any:
        if isinstance(done, Landed) and done.eager is not None:
            self.views[(done.eager.id, done.eager.attempt)] = done.handed
        return done


_THREADED: weakref.WeakKeyDictionary[Any, Threaded] = weakref.WeakKeyDictionary()


def threaded(store: WorkflowStore) -> Threaded:
    """The store's calls with the engine's threading (one per store)."""
    found = _THREADED.get(store)
    if found is None:
        found = _THREADED[store] = Threaded(store)
    return found


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
