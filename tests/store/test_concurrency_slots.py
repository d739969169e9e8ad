"""Concurrency slots: the conformance suite, on memory, SQLite, PostgreSQL and MariaDB.

Every entry and exit of a key is one write serialised on the key: starts that
race on one key (threads released together) never take more slots than its
limit, and a run holds a slot exactly when it is running.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from pikku_celery.engine.passes import take_pass
from pikku_celery.model.slots import ConcurrencySlots, OnLimit
from pikku_celery.model.values import Decision, NewRun, RunStatus
from pikku_celery.ports.store import StoreCapabilities
from pikku_celery.store import WorkflowStore

T = TypeVar("T")
WF = "shop.export"


def slots_of(store: WorkflowStore) -> ConcurrencySlots:
    slots = StoreCapabilities(store).slots
    assert slots is not None
    return slots


def queued_run(store: WorkflowStore) -> str:
    run, created = store.create_run(NewRun(workflow=WF, input=None, status=RunStatus.QUEUED))
    assert created and run.status == RunStatus.QUEUED
    return run.id


def status(store: WorkflowStore, run_id: str) -> RunStatus:
    run = store.get_run(run_id)
    assert run is not None
    return run.status


def holders(slots: ConcurrencySlots, key: str) -> list[str]:
    return [s.run_id for s in slots.slots_of(key) if s.holding]


def waiting(slots: ConcurrencySlots, key: str) -> list[str]:
    return [s.run_id for s in slots.slots_of(key) if not s.holding]


def together(calls: list[Callable[[], T]]) -> list[T]:
    """Run the calls in threads released at once; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


def test_the_first_entry_is_admitted_and_running_the_rest_wait_in_order(
    store: WorkflowStore,
) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(3)]
    entries = [slots.enter_slot(r, "k", 1, "queue") for r in runs]
    assert [(e.admitted, e.queued) for e in entries] == [(True, False)] + [(False, True)] * 2
    assert [status(store, r) for r in runs] == [RunStatus.RUNNING] + [RunStatus.QUEUED] * 2
    assert holders(slots, "k") == runs[:1] and waiting(slots, "k") == runs[1:]
    assert slots.enter_slot(runs[1], "k", 1, "queue").queued  # again: keeps its place
    assert waiting(slots, "k") == runs[1:]


def test_leaving_admits_the_oldest_waiting_run(store: WorkflowStore) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(3)]
    for r in runs:
        slots.enter_slot(r, "k", 1, "queue")
    assert slots.leave_slot(runs[0]) == [runs[1]]
    assert status(store, runs[1]) == RunStatus.RUNNING
    assert slots.leave_slot(runs[0]) == []  # again: nothing
    assert slots.leave_slot(runs[1]) == [runs[2]]
    assert slots.leave_slot(runs[2]) == []
    assert slots.slots_of("k") == []


def test_keys_are_apart_and_a_limit_admits_that_many(store: WorkflowStore) -> None:
    slots = slots_of(store)
    a = [queued_run(store) for _ in range(3)]
    b = queued_run(store)
    assert [slots.enter_slot(r, "a", 2, "queue").admitted for r in a] == [True, True, False]
    assert slots.enter_slot(b, "b", 2, "queue").admitted


def test_cancel_newest_ends_the_new_run(store: WorkflowStore) -> None:
    slots = slots_of(store)
    first, second = queued_run(store), queued_run(store)
    assert slots.enter_slot(first, "k", 1, "cancel_newest").admitted
    entry = slots.enter_slot(second, "k", 1, "cancel_newest")
    assert not entry.admitted and not entry.queued
    run = store.get_run(second)
    assert run is not None and run.status == RunStatus.CANCELLED
    assert run.error is not None and "concurrency" in run.error["message"]
    assert holders(slots, "k") == [first] and waiting(slots, "k") == []


def test_cancel_in_progress_ends_the_waiting_and_names_the_holders(store: WorkflowStore) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(3)]
    policy: OnLimit = "cancel_in_progress"
    assert slots.enter_slot(runs[0], "k", 1, policy).admitted
    second = slots.enter_slot(runs[1], "k", 1, policy)
    assert second.queued and second.to_cancel == [runs[0]]
    third = slots.enter_slot(runs[2], "k", 1, policy)
    assert third.queued and third.ended == [runs[1]] and third.to_cancel == [runs[0]]
    assert status(store, runs[1]) == RunStatus.CANCELLED
    assert slots.leave_slot(runs[0]) == [runs[2]]


def test_cancel_queued_ends_a_queued_run_only(store: WorkflowStore) -> None:
    slots = slots_of(store)
    first, second = queued_run(store), queued_run(store)
    slots.enter_slot(first, "k", 1, "queue")
    slots.enter_slot(second, "k", 1, "queue")
    error = {"type": "WorkflowCancelledError", "message": "asked", "traceback": ""}
    assert not slots.cancel_queued(first, error)  # running: not this way
    assert slots.cancel_queued(second, error)
    assert status(store, second) == RunStatus.CANCELLED
    assert slots.leave_slot(first) == []  # nobody waits any more


def test_stale_and_unslotted_runs_are_found(store: WorkflowStore) -> None:
    slots = slots_of(store)
    held = queued_run(store)
    slots.enter_slot(held, "k", 1, "queue")
    lost = queued_run(store)  # its start stopped before entering
    assert slots.stale_slots(10) == []
    assert [r.id for r in slots.unslotted_runs(0, 10)] == [lost]
    assert slots.unslotted_runs(3_600_000, 10) == []
    # its run settles, and the worker dies before leaving the slot
    take_pass(store, held, None, lambda view: Decision(run_status=RunStatus.COMPLETED))
    assert slots.stale_slots(10) == [held]
    assert slots.leave_slot(held) == []
    assert slots.stale_slots(10) == []
    assert slots.cancel_queued(lost, {"type": "X", "message": "", "traceback": ""})
    assert slots.unslotted_runs(0, 10) == []


def test_racing_starts_on_one_key_take_one_slot(store: WorkflowStore) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(8)]
    entries = together([lambda r=r: slots.enter_slot(r, "race", 1, "queue") for r in runs])
    admitted = [r for r, e in zip(runs, entries, strict=True) if e.admitted]
    assert len(admitted) == 1
    assert holders(slots, "race") == admitted
    order = waiting(slots, "race")
    assert sorted(order) == sorted(set(runs) - set(admitted))
    # Each exit admits exactly the next in start order; one holder at a time.
    holder = admitted[0]
    for expected in order:
        assert slots.leave_slot(holder) == [expected]
        assert holders(slots, "race") == [expected]
        assert status(store, expected) == RunStatus.RUNNING
        assert {status(store, r) for r in waiting(slots, "race")} <= {RunStatus.QUEUED}
        holder = expected


def test_racing_exits_of_one_run_admit_once(store: WorkflowStore) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(4)]
    for r in runs:
        slots.enter_slot(r, "k", 1, "queue")
    results = together([lambda: slots.leave_slot(runs[0]) for _ in range(4)])
    assert sorted(results, key=len) == [[], [], [], [runs[1]]]
    assert holders(slots, "k") == [runs[1]]


@pytest.mark.parametrize("limit", [1, 3])
def test_racing_entries_and_exits_never_exceed_the_limit(store: WorkflowStore, limit: int) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(6)]
    first = together([lambda r=r: slots.enter_slot(r, "mix", limit, "queue") for r in runs])
    assert sum(e.admitted for e in first) == limit
    late = [queued_run(store) for _ in range(4)]
    admitted_runs = [r for r, e in zip(runs, first, strict=True) if e.admitted]
    calls: list[Callable[[], object]] = [lambda r=r: slots.leave_slot(r) for r in admitted_runs]
    calls += [lambda r=r: slots.enter_slot(r, "mix", limit, "queue") for r in late]
    together(calls)
    held = holders(slots, "mix")
    assert len(held) == limit
    running = [r for r in runs + late if status(store, r) == RunStatus.RUNNING]
    assert sorted(running) == sorted(held + admitted_runs)


def test_a_raised_limit_admits_the_waiting_runs_first_at_the_next_entry(
    store: WorkflowStore,
) -> None:
    slots = slots_of(store)
    runs = [queued_run(store) for _ in range(4)]
    for r in runs[:3]:
        slots.enter_slot(r, "k", 1, "queue")  # one holds, two wait
    entry = slots.enter_slot(runs[3], "k", 3, "queue")  # a deploy raised the limit to 3
    assert entry.promoted == runs[1:3] and entry.queued  # the new run still waits its turn
    assert holders(slots, "k") == runs[:3] and waiting(slots, "k") == runs[3:]
    assert [status(store, r) for r in runs] == [RunStatus.RUNNING] * 3 + [RunStatus.QUEUED]
