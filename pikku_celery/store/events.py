"""Progress events as a run's history holds them: value steps ``event:<key>#<n>``.

An event is recorded like any step, so it is written in the transaction of the
pass that reached it and a replay finds it instead of recording it again.
Reading a run's events is reading its value steps of that name, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..model.values import JSON, StepKind, StepState, StepStatus
from ..names import EVENT_PREFIX


@dataclass(frozen=True)
class RunEvent:
    """One ``ctx.set_event(key, value)`` of a run.

    ``number`` counts the run's events of ``key`` from 0 (the latest value of
    a key is the one with the highest number); ``seq`` is its place in the
    run's history; ``created_at`` when it was recorded (epoch ms, the store's
    clock).
    """

    key: str
    value: JSON
    number: int
    seq: int
    created_at: int


def event_step_name(key: str, number: int) -> str:
    """The name of the value step that records event ``number`` of ``key``."""
    return f"{EVENT_PREFIX}{key}#{number}"


def as_event(step: StepState) -> RunEvent | None:
    """The event ``step`` records, or None for any other step."""
    if step.kind != StepKind.VALUE or step.status != StepStatus.SUCCEEDED:
        return None
    if not step.name.startswith(EVENT_PREFIX):
        return None
    key, sep, number = step.name[len(EVENT_PREFIX) :].rpartition("#")
    if not sep or not key or not number.isdigit():
        return None
    return RunEvent(key, step.result, int(number), step.seq, step.created_at)


def event_name_pattern(key: str | None = None) -> str:
    """The SQL ``LIKE`` pattern (escaped with ``/``) of the value steps of
    ``key``'s events, or of every event."""
    if key is None:
        return EVENT_PREFIX.replace("/", "//") + "%"
    name = EVENT_PREFIX + key + "#"
    return name.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"


def of_key(steps: Iterable[StepState], key: str | None) -> list[StepState]:
    """The event steps among ``steps`` (of ``key``, or of every key), in order."""
    found = []
    for step in steps:
        event = as_event(step)
        if event is not None and (key is None or event.key == key):
            found.append(step)
    return sorted(found, key=lambda s: s.seq)


def events_of(steps: Iterable[StepState]) -> list[RunEvent]:
    """Every event among ``steps``, in the order the run recorded them."""
    found = (as_event(s) for s in steps)
    return sorted((e for e in found if e is not None), key=lambda e: e.seq)


def latest_event(events: Iterable[RunEvent], key: str) -> RunEvent | None:
    """The last event of ``key`` (None if the run never set it)."""
    latest: RunEvent | None = None
    for event in events:
        if event.key == key and (latest is None or event.number > latest.number):
            latest = event
    return latest
