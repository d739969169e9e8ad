"""``WorkflowStore.event_steps``: a run's progress events, read alone, on every store."""

from __future__ import annotations

from pikku_celery.store import NewStep, StepKind, StepStatus, WorkflowStore
from pikku_celery.store.events import events_of
from tests.store.support import make_run, task


def value(name: str, seq: int, result: object) -> NewStep:
    return NewStep(name, seq, StepKind.VALUE, StepStatus.SUCCEEDED, result=result)


def test_event_steps_are_the_runs_events_of_a_key_or_all_in_order(store: WorkflowStore) -> None:
    # Keys holding LIKE's wildcards and its escape, a key that is another's
    # prefix, a task step named like an event, ctx.now and a patch marker.
    run, _ = make_run(
        store,
        value("event:a_b#0", 0, 1),
        value("now#0", 1, 123),
        value("event:a%b#0", 2, 2),
        task("event:a_b#9", 3),
        value("event:a/b#0", 4, 3),
        value("event:a_b#1", 5, {"x": [1]}),
        value("event:A_B#0", 6, "other case"),
        value("event:a_bc#0", 7, 5),
        value("patch:wrap", 8, True),
    )
    other, _ = make_run(store, value("event:a_b#0", 0, "another run's"))
    every = store.event_steps(run.id)
    assert [s.name for s in every] == [
        "event:a_b#0",
        "event:a%b#0",
        "event:a/b#0",
        "event:a_b#1",
        "event:A_B#0",
        "event:a_bc#0",
    ]
    assert [(e.key, e.number, e.value) for e in events_of(store.event_steps(run.id, "a_b"))] == [
        ("a_b", 0, 1),
        ("a_b", 1, {"x": [1]}),
    ]
    assert [s.name for s in store.event_steps(run.id, "a%b")] == ["event:a%b#0"]
    assert [s.name for s in store.event_steps(run.id, "a/b")] == ["event:a/b#0"]
    assert [s.name for s in store.event_steps(run.id, "A_B")] == ["event:A_B#0"]
    assert store.event_steps(run.id, "missing") == []
    assert [s.result for s in store.event_steps(other.id)] == ["another run's"]
    assert store.event_steps("6f1c1e0e-1111-4222-8333-444455556666") == []
