"""Why a run of the test environment cannot settle, as far as its store and queue tell."""

from __future__ import annotations

from collections.abc import Iterable

from ..model.values import RunState, StepKind, StepState, StepStatus
from ..names import SIGNAL_PREFIX
from ..store.memory import InMemoryWorkflowStore
from .inline import Message


def signals_awaited(store: InMemoryWorkflowStore, run_id: str) -> list[str]:
    """The signals ``run_id`` waits for now (none once it settled)."""
    state = store.get_run(run_id)
    if state is None or state.status.terminal:
        return []
    return [
        step.name[len(SIGNAL_PREFIX) :]
        for step in store.get_steps(run_id)
        if step.kind == StepKind.SIGNAL and _open(step)
    ]


def why_unsettled(store: InMemoryWorkflowStore, messages: Iterable[Message], run: RunState) -> str:
    """Why ``run`` is not settled: what each of its open steps (and children's) waits for."""
    queued = list(messages)
    if run.status.terminal:
        return f"workflow run {run.id} ({run.workflow}) is {run.status}"
    reasons = _blockers(store, queued, run, set())
    if any(m.run_id == run.id for m in queued):
        reasons.insert(0, "it still has messages queued (delivered by the next drive)")
    head = (
        f"workflow run {run.id} ({run.workflow}) cannot settle: it is {run.status}, "
        "nothing more is queued for it and no timer of it is due"
    )
    return head + "; " + "; ".join(reasons or ["no step of it is open"])


def describe(msg: Message) -> str:
    """A queued message in a few words."""
    if msg.kind == "step":
        return f"step {msg.task_name} of run {msg.run_id[:8]}"
    return f"wake-up ({msg.reason or 'run'}) of run {msg.run_id[:8]}"


def _blockers(
    store: InMemoryWorkflowStore, queued: list[Message], run: RunState, seen: set[str]
) -> list[str]:
    seen.add(run.id)
    reasons: list[str] = []
    blocked = getattr(run, "blocked", None)
    if blocked:
        reasons.append(f"no pass can run: {blocked}")
    queued_steps = {m.step_id for m in queued if m.kind == "step"}
    for step in store.get_steps(run.id):
        if not _open(step):
            continue
        if step.kind == StepKind.SIGNAL:
            name = step.name[len(SIGNAL_PREFIX) :]
            timeout = " (no timeout)" if step.wake_at is None else ""
            reasons.append(
                f"it waits for signal {name!r}{timeout}, which nobody sent: send it, before "
                f"or during the wait, with pikku.send_signal({run.id!r}, {name!r}, payload)"
            )
        elif step.kind == StepKind.CHILD and step.child_run_id:
            reasons.extend(_child_blocker(store, queued, step, seen))
        elif step.kind == StepKind.TASK and step.id not in queued_steps:
            reasons.append(_task_blocker(step))
        elif step.kind == StepKind.SLEEP:
            reasons.append(f"its timer {step.name!r} has no wake-up queued")
    return reasons


def _child_blocker(
    store: InMemoryWorkflowStore, queued: list[Message], step: StepState, seen: set[str]
) -> list[str]:
    assert step.child_run_id is not None
    child = store.get_run(step.child_run_id)
    if child is None or child.id in seen:
        return []
    if child.status.terminal:
        return [
            f"its child step {step.name!r} is open though child run {child.id} "
            f"ended {child.status} (a lost wake-up: env.sweep() repairs it)"
        ]
    inner = "; ".join(_blockers(store, queued, child, seen)) or "no step of it is open"
    return [
        f"its step {step.name!r} waits for child run {child.id} ({child.workflow}), where {inner}"
    ]


def _task_blocker(step: StepState) -> str:
    what = f"its step {step.name!r} (task {step.task_name})"
    if step.status == StepStatus.RUNNING:
        return (
            f"{what} is running attempt {step.attempt} with no worker: its lease must "
            "lapse (env.advance(...)) and the sweep (env.sweep()) take it over"
        )
    if step.status == StepStatus.FAILED:
        return f"{what} waits for its next attempt, but no message for it is queued"
    return (
        f"{what} is {step.status} but no message for it is queued (dropped?): env.sweep() "
        "sends it again, as beat would, once the engine's message_grace has passed"
    )


def _open(step: StepState) -> bool:
    return not step.settled and step.status != StepStatus.SUCCEEDED
