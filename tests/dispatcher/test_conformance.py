"""The dispatcher contract, checked the same way on every adapter.

Each promise of the port (``pikku_celery/engine/dispatcher.py``) that the
engine relies on is one test below, run on Celery (a real in-process worker
on the memory broker) and on the inline dispatcher. Deliveries are observed
on the engine side only (``execute_step`` / ``orchestrate``). Nothing waits
by sleeping a fixed time: tests poll with a deadline, and a barrier message
sent last on the same queue tells when everything before it has arrived.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pikku_celery.engine.observe import run_trace
from pikku_celery.errors import UnknownTaskError
from tests.dispatcher.conftest import (
    DEFAULT_LEASE_MS,
    FAST_LEASE_MS,
    SLOW_LEASE_MS,
    Harness,
    new_id,
    new_name,
)

# A delivered ETA message is due at send time + countdown; Celery carries the
# ETA as wall-clock ISO text (microseconds) and turns it back into monotonic
# time, so allow a hair of rounding. An adapter that ignores the countdown
# delivers within tens of milliseconds, far outside this.
CLOCK_TOLERANCE = 0.005
COUNTDOWN = 0.5


def _not_a_task() -> None:
    """A plain function no dispatcher registered."""


# --- tasks ----------------------------------------------------------------------


def test_task_name_of_a_task_and_of_its_name_is_the_name(harness: Harness) -> None:
    name = new_name()
    task = harness.register_task(name)
    assert harness.dispatcher.task_name(task) == name
    assert harness.dispatcher.task_name(name) == name


@pytest.mark.parametrize(
    "task",
    [
        "conformance.never-registered",
        "",
        None,
        42,
        object(),
        _not_a_task,
        # pikku's own tasks are never workflow steps.
        "pikku.run_step",
        "pikku.orchestrate",
        "pikku.sweep",
    ],
    ids=lambda task: repr(task).split(" at 0x")[0].lstrip("<"),  # alike in every process
)
def test_task_name_refuses_what_workers_cannot_run(harness: Harness, task: Any) -> None:
    with pytest.raises(UnknownTaskError):
        harness.dispatcher.task_name(task)


def test_task_name_refuses_a_task_of_another_dispatcher(harness: Harness) -> None:
    name = new_name()
    foreign = harness.build({}, DEFAULT_LEASE_MS).register_task(name)
    with pytest.raises(UnknownTaskError):
        harness.dispatcher.task_name(foreign)
    with pytest.raises(UnknownTaskError):
        harness.dispatcher.task_name(name)


# --- queues ---------------------------------------------------------------------


def test_task_queue_of_a_task_declaring_none_is_the_default_queue(
    harness: Harness, plain_task: str
) -> None:
    assert harness.dispatcher.task_queue(plain_task) == harness.adapter.default_queue
    assert harness.dispatcher.task_queue(plain_task, None) == harness.adapter.default_queue
    assert harness.dispatcher.task_queue(plain_task, {}) == harness.adapter.default_queue


def test_task_queue_is_the_queue_the_task_declares(harness: Harness, slow_task: str) -> None:
    assert harness.dispatcher.task_queue(slow_task) == harness.slow_queue
    assert harness.dispatcher.lease_ms(harness.dispatcher.task_queue(slow_task)) == SLOW_LEASE_MS


@pytest.mark.parametrize("declared", [False, True], ids=["plain-task", "task-with-a-queue"])
def test_task_queue_honours_a_queue_route(harness: Harness, declared: bool) -> None:
    name = new_name()
    harness.register_task(name, queue=harness.slow_queue if declared else None)
    routed = harness.dispatcher.task_queue(name, {"queue": harness.fast_queue})
    assert routed == harness.fast_queue
    other = harness.dispatcher.task_queue(name, {"queue": harness.other_queue})
    assert other == harness.other_queue


# --- leases ---------------------------------------------------------------------


def test_lease_ms_of_a_configured_queue_is_its_lease(harness: Harness) -> None:
    fast, slow = new_name("fast"), new_name("slow")
    dispatcher = harness.build({fast: 2_500, slow: 12_345}, 7_000).dispatcher
    assert dispatcher.lease_ms(fast) == 2_500
    assert dispatcher.lease_ms(slow) == 12_345
    # The delivering dispatcher too.
    assert harness.dispatcher.lease_ms(harness.fast_queue) == FAST_LEASE_MS
    assert harness.dispatcher.lease_ms(harness.slow_queue) == SLOW_LEASE_MS


def test_lease_ms_of_an_unconfigured_queue_is_the_default(harness: Harness) -> None:
    adapter = harness.build({new_name("fast"): 2_500}, 7_000)
    assert adapter.dispatcher.lease_ms(None) == 7_000
    assert adapter.dispatcher.lease_ms(new_name("unconfigured")) == 7_000
    assert adapter.dispatcher.lease_ms(adapter.default_queue) == 7_000
    assert harness.dispatcher.lease_ms(harness.other_queue) == DEFAULT_LEASE_MS


@pytest.mark.parametrize(
    ("leases", "default", "longest"),
    [
        ({"a": 2_000, "b": 11_000}, 5_000, 11_000),  # a configured queue is longest
        ({"a": 2_000, "b": 3_000}, 8_000, 8_000),  # the default lease is longest
        ({}, 4_000, 4_000),  # nothing configured
    ],
    ids=["configured-longest", "default-longest", "none-configured"],
)
def test_longest_lease_ms_is_the_longest_any_queue_grants(
    harness: Harness, leases: dict[str, int], default: int, longest: int
) -> None:
    tag = new_name("q")
    configured = {f"{tag}-{queue}": ms for queue, ms in leases.items()}
    adapter = harness.build(configured, default)
    dispatcher = adapter.dispatcher
    assert dispatcher.longest_lease_ms() == longest
    for queue in [*configured, None, adapter.default_queue, new_name("unconfigured")]:
        assert dispatcher.longest_lease_ms() >= dispatcher.lease_ms(queue)
    assert harness.dispatcher.longest_lease_ms() == SLOW_LEASE_MS


def test_max_countdown_is_positive_and_safe_on_every_queue(harness: Harness) -> None:
    fast, slow = new_name("fast"), new_name("slow")
    adapter = harness.build({fast: 2_000, slow: 20_000}, 6_000)
    dispatcher = adapter.dispatcher
    for queue in [fast, slow, None, adapter.default_queue, new_name("unconfigured")]:
        countdown = dispatcher.max_countdown(queue)
        assert countdown > 0, queue
        if harness.countdown_within_lease:
            # A countdown must end before the broker would redeliver the message.
            assert countdown * 1000 < dispatcher.lease_ms(queue), queue


# --- sending --------------------------------------------------------------------


def route_for(harness: Harness, which: str | None) -> dict[str, Any] | None:
    """``ctx.step(queue=...)``'s route to the configured or the unconfigured queue."""
    queues = {"fast": harness.fast_queue, "other": harness.other_queue}
    return None if which is None else {"queue": queues[which]}


@pytest.mark.parametrize(
    ("declared", "which"),
    [(False, None), (True, None), (False, "fast"), (False, "other"), (True, "fast")],
    ids=[
        "default-queue",
        "task-declared-queue",
        "routed-to-configured-queue",
        "routed-to-unconfigured-queue",
        "route-over-declared-queue",
    ],
)
def test_send_step_delivers_one_message_carrying_the_step(
    harness: Harness, plain_task: str, slow_task: str, declared: bool, which: str | None
) -> None:
    task = slow_task if declared else plain_task
    route = route_for(harness, which)
    step = harness.step(task, route)
    harness.dispatcher.send_step(step)
    [delivered] = harness.wait_for(lambda: harness.recorder.steps_of(step.run_id))
    assert (delivered.run_id, delivered.step_id, delivered.task_name, delivered.queue) == (
        step.run_id,
        step.id,
        task,
        step.queue,
    )
    harness.settle(task, route)
    assert len(harness.recorder.steps_of(step.run_id)) == 1
    assert harness.recorder.wakes_of(step.run_id) == []


def test_messages_carry_the_run_trace_they_were_sent_under(
    harness: Harness, plain_task: str
) -> None:
    carrier = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "pikku-workflow": "w"}
    traced, plain = harness.step(plain_task), harness.step(plain_task)
    token = run_trace.set(carrier)
    try:
        harness.dispatcher.send_step(traced)
        harness.dispatcher.wake_run(traced.run_id, reason="traced")
    finally:
        run_trace.reset(token)
    harness.dispatcher.send_step(plain)
    harness.dispatcher.wake_run(plain.run_id, reason="plain")
    harness.settle(plain_task)
    [step] = harness.recorder.steps_of(traced.run_id)
    [wake] = harness.recorder.wakes_of(traced.run_id)
    assert step.trace == wake.trace == carrier
    [step] = harness.recorder.steps_of(plain.run_id)
    [wake] = harness.recorder.wakes_of(plain.run_id)
    assert step.trace is None and wake.trace is None


@pytest.mark.parametrize("reason", ["signal", "child-ended", None], ids=repr)
def test_wake_run_delivers_one_orchestrate_with_its_reason(
    harness: Harness, plain_task: str, reason: str | None
) -> None:
    run_id = new_id()
    if reason is None:
        harness.dispatcher.wake_run(run_id)  # the reason defaults to ""
    else:
        harness.dispatcher.wake_run(run_id, reason=reason)
    [delivered] = harness.wait_for(lambda: harness.recorder.wakes_of(run_id))
    assert (delivered.run_id, delivered.reason) == (run_id, reason or "")
    harness.settle(plain_task)
    assert len(harness.recorder.wakes_of(run_id)) == 1
    assert harness.recorder.steps_of(run_id) == []


def test_messages_without_countdown_are_all_delivered_once(
    harness: Harness, plain_task: str
) -> None:
    count = 30
    fast = route_for(harness, "fast")
    steps = [harness.step(plain_task, None if i % 2 else fast) for i in range(count)]
    wakes = [(new_id(), f"reason-{i}") for i in range(count)]
    for step, (run_id, reason) in zip(steps, wakes, strict=True):
        harness.dispatcher.send_step(step)
        harness.dispatcher.wake_run(run_id, reason=reason)

    def all_arrived() -> bool:
        return all(harness.recorder.steps_of(s.run_id) for s in steps) and all(
            harness.recorder.wakes_of(run_id) for run_id, _ in wakes
        )

    harness.wait_for(all_arrived)
    harness.settle(plain_task, None)
    harness.settle(plain_task, fast)
    for step in steps:
        [delivered] = harness.recorder.steps_of(step.run_id)
        assert (delivered.step_id, delivered.queue) == (step.id, step.queue)
    for run_id, reason in wakes:
        assert [d.reason for d in harness.recorder.wakes_of(run_id)] == [reason]


@pytest.mark.parametrize("kind", ["step", "wake"])
def test_a_countdown_delays_delivery_until_it_ends(
    harness: Harness, plain_task: str, kind: str
) -> None:
    step = harness.step(plain_task, route_for(harness, "fast"))
    # The engine sends a countdown only when it is within max_countdown.
    assert harness.dispatcher.max_countdown(step.queue) >= COUNTDOWN
    assert harness.dispatcher.max_countdown(None) >= COUNTDOWN
    sent_at = time.monotonic()
    if kind == "step":
        harness.dispatcher.send_step(step, countdown=COUNTDOWN)
    else:
        harness.dispatcher.wake_run(step.run_id, countdown=COUNTDOWN, reason="timer")

    def arrived() -> list[Any]:
        if kind == "step":
            return list(harness.recorder.steps_of(step.run_id))
        return list(harness.recorder.wakes_of(step.run_id))

    [delivered] = harness.wait_for(arrived, timeout=COUNTDOWN + 10)
    assert delivered.at >= sent_at + COUNTDOWN - CLOCK_TOLERANCE, delivered.at - sent_at
    if kind == "step":
        assert (delivered.step_id, delivered.queue) == (step.id, step.queue)
    else:
        assert delivered.reason == "timer"
