"""The same pass plans, written by every store, read back the same.

One script of passes (fan-out, an outcome with an eager claim, a retry
redispatched, a child run that settles its parent's step, a cancel that
closes what is open) is planned with ``plan_pass`` on each store's own view
and written with ``write_pass``; what each store then reads back (runs,
steps, attempts, and what each write said to publish) equals what the
memory store, the reference, reads back. Times and broker claims' random
ids differ by store and are left out.
"""

from __future__ import annotations

from typing import Any

import pytest

from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.model.plan import Moved, outcome_write, plan_pass, view_after
from pikku_celery.model.values import (
    AdvanceResult,
    Decision,
    EagerClaim,
    NewRun,
    NewStep,
    RunStatus,
    StepKind,
    StepOutcome,
    StepState,
)
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from tests.store.support import LONG, claim, task

RUN = "3f1c2b4a-5d6e-4f70-8a9b-0c1d2e3f4a5b"
CHILD = "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"
TIMES = {
    "created_at",
    "updated_at",
    "lease_expires_at",
    "scheduled_at",
    "started_at",
    "finished_at",
    "renewed_at",
    "wake_at",
    "next_sweep_at",
    "deadline_at",
}


def write(
    store: WorkflowStore, run_id: str, decision: Decision, outcome: StepOutcome | None = None
) -> AdvanceResult:
    """One pass planned on the store's view of the run and written by it.

    An unlocked read serves only the one write: a plan it does not take is
    Moved, and planned again on a locked read (as the engine does)."""
    for optimistic in (outcome is not None, False):
        read = store.read_pass(run_id, optimistic=optimistic)
        written = None if outcome is None else outcome_write(read.view, outcome)
        seen = view_after(read.view, written)
        done = store.write_pass(read, plan_pass(seen, written, decision))
        if not isinstance(done, Moved):
            return done
    raise AssertionError(f"the pass of run {run_id} was moved twice with nothing else running")


def step_named(store: WorkflowStore, run_id: str, name: str) -> StepState:
    [step] = [s for s in store.get_steps(run_id) if s.name == name]
    return step


def script(store: WorkflowStore) -> list[Any]:
    """The passes, and what each one's write said to publish and wake."""
    store.create_run(NewRun(workflow="wf", input={"n": 1}, id=RUN))
    said = [write(store, RUN, Decision(new_steps=[task("a", 0), task("b", 1, max_attempts=2)]))]
    a = claim(store, step_named(store, RUN, "a"), "w1")
    eager = EagerClaim("c", "w1", LONG, "e" * 32)
    said.append(
        write(
            store,
            RUN,
            Decision(new_steps=[task("c", 2)], eager=eager),
            StepOutcome(a.id, a.attempt, ok=True, result={"x": 1}, claim_id=a.claim_id),
        )
    )
    b = claim(store, step_named(store, RUN, "b"), "w2")
    failed = StepOutcome(b.id, b.attempt, ok=False, error={"type": "E"}, retry_delay=0.0)
    said.append(write(store, RUN, Decision(redispatch=[b.id]), failed))
    c = step_named(store, RUN, "c")
    kid = NewStep("kid", 3, StepKind.CHILD, child=NewRun(workflow="kid", input=[2], id=CHILD))
    done = StepOutcome(c.id, c.attempt, ok=True, result="c", claim_id=c.claim_id)
    said.append(write(store, RUN, Decision(new_steps=[kid, task("d", 4)]), done))
    said.append(write(store, CHILD, Decision(run_status=RunStatus.COMPLETED, output=5)))
    said.append(write(store, RUN, Decision(run_status=RunStatus.CANCELLED)))
    return [
        (
            [s.name for s in r.steps],
            None if r.eager is None else r.eager.name,
            r.parent_to_wake,
            r.children_to_wake,
            shown(r.run),
        )
        for r in said
    ]


def shown(value: Any) -> dict[str, Any]:
    """A stored value without its times (and a broker claim's random id)."""
    fields = {k: v for k, v in vars(value).items() if k not in TIMES}
    if fields.get("claim_id") not in (None, "e" * 32):
        fields["claim_id"] = "random"
    return fields


def read_back(store: WorkflowStore, said: list[Any]) -> dict[str, Any]:
    return {
        "said": said,
        "runs": [shown(store.get_run(run_id)) for run_id in (RUN, CHILD)],
        "steps": {r: [shown(s) for s in store.get_steps(r)] for r in (RUN, CHILD)},
        "attempts": sorted(
            (shown(a) for a in store.get_attempts(RUN)), key=lambda a: (a["step_id"], a["attempt"])
        ),
    }


def test_every_store_reads_back_what_the_memory_store_does(store: WorkflowStore) -> None:
    reference = InMemoryWorkflowStore()
    expected = read_back(reference, script(reference))
    got = read_back(store, script(store))
    assert got == expected
    # What the script is about: each kind of write happened.
    [run, child] = got["runs"]
    assert (run["status"], child["status"], child["output"]) == ("cancelled", "completed", 5)
    assert got["said"][1][1] == "c" and got["said"][4][2] == RUN
    steps = {s["name"]: s for s in got["steps"][RUN]}
    assert steps["kid"]["result"] == 5 and steps["d"]["error"]["type"] == "WorkflowCancelledError"
    assert steps["b"]["error"] == {"type": "E"}  # waiting for its retry: not open, kept


def test_a_plan_on_a_moved_run_writes_nothing(store: WorkflowStore) -> None:
    store.create_run(NewRun(workflow="wf", input=None, id=RUN))
    read = store.read_pass(RUN)
    plan = plan_pass(read.view, None, Decision(new_steps=[task("late", 0)]))
    store.send_signal(RUN, "go", 1)  # moves the run's version
    before = store.get_run(RUN)
    assert store.write_pass(read, plan) == Moved(RUN)
    assert store.get_run(RUN) == before and store.get_steps(RUN) == []


def test_a_plan_whose_outcome_is_superseded_writes_nothing(store: WorkflowStore) -> None:
    store.create_run(NewRun(workflow="wf", input=None, id=RUN))
    write(store, RUN, Decision(new_steps=[task("a", 0)]))
    got = claim(store, step_named(store, RUN, "a"), "w1")
    read = store.read_pass(RUN)
    done = StepOutcome(got.id, got.attempt, ok=True, result=1, claim_id=got.claim_id)
    written = outcome_write(read.view, done)
    plan = plan_pass(view_after(read.view, written), written, Decision(new_steps=[task("b", 1)]))
    store.complete_step(got.id, got.attempt, "first", got.claim_id)  # the outcome lands first
    with pytest.raises(WorkflowStepSupersededError):
        store.write_pass(read, plan)
    assert [s.name for s in store.get_steps(RUN)] == ["a"]
    assert step_named(store, RUN, "a").result == "first"
