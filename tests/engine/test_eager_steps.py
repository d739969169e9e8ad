"""Eager steps in the engine: a run's next step runs where the last one finished.

On the inline dispatcher with eager steps on (every task "runs here"), on
the memory, SQLite and PostgreSQL stores: what runs eagerly, what travels
as a message, and the budget and opt-outs. The Celery side (queues a worker
consumes, per-message limits, shutdown) is tested on real workers in
tests/celery/test_eager_workers.py.
"""

from __future__ import annotations

import time
from typing import Any

from pikku_celery.engine import Context
from pikku_celery.model.values import BROKER, EAGER, AttemptStatus
from pikku_celery.store import WorkflowStore
from pikku_celery.testing import InlineDispatcher
from tests.engine.conftest import Harness, make_harness


def eager_harness(store: WorkflowStore, **options: Any) -> Harness:
    return make_harness(store, dispatcher=InlineDispatcher(eager=True), **options)


def dispatches(h: Harness, run_id: str) -> list[tuple[str, int, str | None]]:
    """(step, attempt, dispatch) of every attempt of the run, in step order."""
    seq = {s.id: (s.seq, s.name) for s in h.engine.store.get_steps(run_id)}
    rows = sorted(h.engine.store.get_attempts(run_id), key=lambda a: (seq[a.step_id], a.attempt))
    return [(seq[a.step_id][1], a.attempt, a.dispatch) for a in rows]


def step_messages(h: Harness) -> int:
    return sum(1 for m in h.dispatcher.sent if m.kind == "step")


def sequential(h: Harness, n: int, **workflow_options: Any) -> Any:
    @h.task
    def add(x: int) -> int:
        return x + 1

    @h.workflow(name="seq", **workflow_options)
    def seq(ctx: Context, x: int) -> int:
        for i in range(n):
            x = ctx.step(f"s{i}", add, x)
        return x

    return seq


def test_a_sequential_run_takes_one_message_and_runs_the_rest_eagerly(
    store: WorkflowStore,
) -> None:
    h = eager_harness(store)
    handle = sequential(h, 6).start(0)
    h.run()
    assert handle.result() == 6
    assert step_messages(h) == 1
    assert dispatches(h, handle.run_id) == [
        ("s0", 1, BROKER),
        *[(f"s{i}", 1, EAGER) for i in range(1, 6)],
    ]
    attempts = h.engine.store.get_attempts(handle.run_id)
    assert {a.status for a in attempts} == {AttemptStatus.SUCCEEDED}
    assert len({a.claim_id for a in attempts}) == 6  # every claim its own id


def test_the_budget_hands_the_run_back_to_the_broker_when_spent(store: WorkflowStore) -> None:
    h = eager_harness(store, eager_max_steps=2)
    handle = sequential(h, 7).start(0)
    h.run()
    assert handle.result() == 7
    assert [d for _, _, d in dispatches(h, handle.run_id)] == [
        BROKER, EAGER, EAGER, BROKER, EAGER, EAGER, BROKER,
    ]  # fmt: skip
    assert step_messages(h) == 3


def test_a_spent_time_budget_runs_nothing_eagerly(store: WorkflowStore) -> None:
    h = eager_harness(store, eager_max_seconds=0)
    handle = sequential(h, 3).start(0)
    h.run()
    assert handle.result() == 3
    assert {d for _, _, d in dispatches(h, handle.run_id)} == {BROKER}


def test_of_a_fan_out_one_step_runs_eagerly_and_the_rest_are_published(
    store: WorkflowStore,
) -> None:
    h = eager_harness(store)

    @h.task
    def double(x: int) -> int:
        return 2 * x

    @h.workflow(name="fan")
    def fan(ctx: Context) -> list[int]:
        first = ctx.step("first", double, 1)
        handles = [ctx.step_async(f"b{i}", double, first + i) for i in range(3)]
        return ctx.gather(*handles)

    handle = fan.start()
    h.run()
    assert handle.result() == [4, 6, 8]
    by_step = {name: d for name, _, d in dispatches(h, handle.run_id)}
    assert by_step["first"] == BROKER
    assert sorted(by_step[f"b{i}"] or "" for i in range(3)) == [BROKER, BROKER, EAGER]
    assert step_messages(h) == 3


def test_a_retried_attempt_travels_through_the_broker(store: WorkflowStore) -> None:
    h = eager_harness(store)

    @h.task
    def flaky(x: int) -> int:
        if h.count("flaky") == 1:
            raise RuntimeError("first attempt fails")
        return x

    @h.task
    def first(x: int) -> int:
        return x

    @h.workflow(name="retried")
    def retried(ctx: Context) -> int:
        return int(ctx.step("b", flaky, ctx.step("a", first, 5), retries=1, retry_delay=0))

    handle = retried.start()
    h.run()
    assert handle.result() == 5
    assert dispatches(h, handle.run_id) == [("a", 1, BROKER), ("b", 1, EAGER), ("b", 2, BROKER)]


def test_a_step_after_a_timer_travels_through_the_broker(store: WorkflowStore) -> None:
    h = eager_harness(store)

    @h.task
    def one() -> int:
        return 1

    @h.workflow(name="sleeper")
    def sleeper(ctx: Context) -> int:
        a = ctx.step("a", one)
        ctx.sleep("nap", 0.05)
        return int(a + ctx.step("b", one))

    handle = sleeper.start()
    h.run()
    assert handle.result() == 2
    assert [d for _, _, d in dispatches(h, handle.run_id) if d] == [BROKER, BROKER]


def test_the_engine_option_turns_eager_steps_off(store: WorkflowStore) -> None:
    h = eager_harness(store, eager_steps=False)
    handle = sequential(h, 3).start(0)
    h.run()
    assert handle.result() == 3
    assert {d for _, _, d in dispatches(h, handle.run_id)} == {BROKER}
    assert step_messages(h) == 3


def test_a_workflow_opts_out_of_eager_steps(store: WorkflowStore) -> None:
    h = eager_harness(store)
    handle = sequential(h, 3, eager_steps=False).start(0)
    h.run()
    assert handle.result() == 3
    assert {d for _, _, d in dispatches(h, handle.run_id)} == {BROKER}


def test_a_step_opts_out_of_running_eagerly(store: WorkflowStore) -> None:
    h = eager_harness(store)

    @h.task
    def add(x: int) -> int:
        return x + 1

    @h.workflow(name="mixed")
    def mixed(ctx: Context) -> int:
        x = ctx.step("a", add, 0)
        x = ctx.step("b", add, x, eager=False)
        return int(ctx.step("c", add, x))

    handle = mixed.start()
    h.run()
    assert handle.result() == 3
    assert dispatches(h, handle.run_id) == [("a", 1, BROKER), ("b", 1, BROKER), ("c", 1, EAGER)]


def test_a_redelivered_carrying_message_changes_nothing(store: WorkflowStore) -> None:
    """The message whose call ran the eager steps, delivered again (a broker
    that redelivers after a lost ack): its own step is settled."""
    h = eager_harness(store)
    handle = sequential(h, 4).start(0)
    [carrier] = [m for m in h.dispatcher.messages if m.kind == "step"]
    h.run()
    before = dispatches(h, handle.run_id)
    h.dispatcher.deliver(carrier)
    h.run()
    assert dispatches(h, handle.run_id) == before
    assert handle.result() == 4


def test_the_time_budget_ends_within_half_the_carrying_queues_lease(
    store: WorkflowStore,
) -> None:
    """The carrying message stays unacknowledged while its eager steps run:
    on a queue whose lease (its redelivery horizon) is 1 s, a message hands
    its run back within 0.5 s, whatever eager_max_seconds says."""
    short = make_harness(store, dispatcher=InlineDispatcher(eager=True, lease_ms=1000))
    long = make_harness(store, dispatcher=InlineDispatcher(eager=True, lease_ms=60_000))
    for h in (short, long):

        @h.task
        def work(x: int) -> int:
            time.sleep(0.2)  # the work itself
            return x + 1

        @h.workflow(name="slow")
        def slow(ctx: Context) -> int:
            x = 0
            for i in range(6):
                x = ctx.step(f"s{i}", work, x)
            return x

    hops = {}
    for label, h in (("short", short), ("long", long)):
        handle = h.engine.start("slow")
        h.run(timeout=30)
        assert handle.result() == 6
        hops[label] = [d for _, _, d in dispatches(h, handle.run_id)].count(BROKER)
    assert hops["long"] == 1
    assert hops["short"] >= 2
