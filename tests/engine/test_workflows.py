"""Engine behaviour a workflow author relies on, on every store."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.engine.resume import release_all
from pikku_celery.errors import (
    IdempotencyKeyReusedError,
    PayloadError,
    RunSettledError,
    SignalTimeoutError,
    StepFailedError,
    UnknownTaskError,
    UnknownWorkflowError,
    WorkflowCancelledError,
    WorkflowFailedError,
)
from pikku_celery.lease import hold_lease
from pikku_celery.store import AttemptStatus, RunStatus, StepStatus

from .conftest import Harness


def test_linear_workflow_returns_each_steps_result(h: Harness) -> None:
    @h.task
    def add(a: int, b: int) -> int:
        return a + b

    @h.workflow
    def sums(ctx: Context, n: int) -> list[int]:
        x = ctx.step("first", add, n, 1)
        y = ctx.step("second", add, x, 10)
        z = ctx.step("third", add, y, b=100)
        return [x, y, z]

    run = sums.start(1)
    h.run()
    assert run.wait(timeout=5) == [2, 12, 112]
    history = run.steps()
    assert [s.step.name for s in history] == ["first", "second", "third"]
    assert all(s.step.attempt == 1 and len(s.attempts) == 1 for s in history)
    assert all(s.attempts[0].status == AttemptStatus.SUCCEEDED for s in history)


def test_retries_follow_delay_and_backoff(h: Harness) -> None:
    @h.task
    def flaky() -> str:
        if h.count("flaky") < 3:
            raise ConnectionError("card network busy")
        return "charged"

    @h.workflow
    def pay(ctx: Context) -> Any:
        return ctx.step("charge", flaky, retries=3, retry_delay=0.05, backoff=2)

    run = pay.start()
    h.run()
    assert run.wait(timeout=5) == "charged"
    (charge,) = run.steps()
    assert [a.status for a in charge.attempts] == [
        AttemptStatus.FAILED,
        AttemptStatus.FAILED,
        AttemptStatus.SUCCEEDED,
    ]
    assert charge.attempts[0].error is not None
    assert charge.attempts[0].error["type"] == "ConnectionError"
    # Each attempt starts no sooner than its delay: 50 ms, then 100 ms.
    gaps = [
        b.started_at - (a.finished_at or 0)
        for a, b in zip(charge.attempts, charge.attempts[1:], strict=False)
    ]
    assert gaps[0] >= 45 and gaps[1] >= 95, gaps


def test_a_step_that_always_fails_can_be_compensated(h: Harness) -> None:
    @h.task
    def ship(order: int) -> str:
        raise RuntimeError(f"no courier for order {order}")

    @h.task
    def refund(order: int) -> str:
        return f"refunded {order}"

    @h.workflow
    def fulfil(ctx: Context, order: int) -> dict[str, Any]:
        try:
            ctx.step("ship", ship, order, retries=1, retry_delay=0)
        except StepFailedError as exc:
            assert exc.error_type == "RuntimeError"
            assert "no courier for order 7" in exc.message
            assert "RuntimeError" in exc.traceback
            return {"refund": ctx.step("refund", refund, order)}
        return {"shipped": True}

    run = fulfil.start(7)
    h.run()
    assert run.wait(timeout=5) == {"refund": "refunded 7"}
    ship_step = run.steps()[0]
    assert ship_step.step.status == StepStatus.FAILED
    assert len(ship_step.attempts) == 2


def test_an_uncaught_step_failure_fails_the_run(h: Harness) -> None:
    @h.task
    def boom() -> None:
        raise ValueError("bad card")

    @h.workflow
    def wf(ctx: Context) -> None:
        ctx.step("boom", boom)

    run = wf.start()
    h.run()
    with pytest.raises(WorkflowFailedError) as info:
        run.wait(timeout=5)
    assert info.value.error["type"] == "StepFailedError"
    assert "bad card" in info.value.error["message"]


def test_sleep_and_sleep_until_are_durable_timers(h: Harness) -> None:
    @h.task
    def stamp() -> str:
        return "done"

    @h.workflow
    def wf(ctx: Context) -> Any:
        started = ctx.now()
        ctx.sleep("cool-off", 0.15)
        ctx.sleep_until("until", started + timedelta(seconds=0.25))
        ctx.sleep("zero", 0)
        return [ctx.step("after", stamp), ctx.now().isoformat() > started.isoformat()]

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == ["done", True]
    steps = {s.step.name: s.step for s in run.steps()}
    now0 = steps["now#0"].result
    assert steps["after"].created_at - now0 >= 250
    assert steps["cool-off"].status == StepStatus.SUCCEEDED


def test_sleep_until_requires_an_aware_datetime(h: Harness) -> None:
    @h.workflow
    def wf(ctx: Context) -> None:
        ctx.sleep_until("naive", datetime(2030, 1, 1))

    run = wf.start()
    with pytest.raises(WorkflowFailedError, match="aware datetime"):
        run.wait(timeout=5)


def test_child_workflow_success_and_failure(h: Harness) -> None:
    @h.task
    def label(order: int) -> str:
        if order < 0:
            raise LookupError("no address")
        return f"label-{order}"

    @h.workflow(name="shipping")
    def shipping(ctx: Context, order: int) -> str:
        return str(ctx.step("label", label, order))

    @h.workflow
    def parent(ctx: Context, order: int) -> Any:
        try:
            return ctx.child("ship", shipping, order)
        except StepFailedError as exc:
            return f"failed: {exc.message}"

    ok = parent.start(5)
    bad = parent.start(-1)
    h.run()
    assert ok.wait(timeout=5) == "label-5"
    assert "no address" in bad.wait(timeout=5)
    child_id = ok.steps()[0].step.child_run_id
    assert child_id is not None
    child = h.engine.handle(child_id).state()
    assert child.status == RunStatus.COMPLETED
    assert child.parent_run_id == ok.run_id


def test_parallel_fan_out_joins_in_order_and_reports_a_failing_branch(h: Harness) -> None:
    @h.task
    def reserve(sku: str) -> str:
        if sku == "out-of-stock":
            raise RuntimeError(f"{sku} unavailable")
        return f"reserved {sku}"

    @h.workflow
    def wf(ctx: Context, skus: list[str]) -> Any:
        handles = [ctx.step_async(f"reserve-{s}", reserve, s) for s in skus]
        results = ctx.gather(*handles, return_exceptions=True)
        return [r if isinstance(r, str) else f"error: {r.message}" for r in results]

    run = wf.start(["a", "out-of-stock", "c"])
    # All three steps are in flight at once after the first pass.
    assert sum(1 for m in h.dispatcher.messages if m.kind == "step") == 3
    h.run()
    assert run.wait(timeout=5) == [
        "reserved a",
        "error: out-of-stock unavailable",
        "reserved c",
    ]


def test_gather_raises_the_first_failure_after_all_settle(h: Harness) -> None:
    @h.task
    def maybe(x: int) -> int:
        if x == 2:
            raise ValueError("two")
        return x

    @h.workflow
    def wf(ctx: Context) -> Any:
        try:
            ctx.gather(*(ctx.step_async(f"s{i}", maybe, i) for i in range(4)))
        except StepFailedError as exc:
            return exc.step
        return None

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == "s2"
    assert all(s.step.settled for s in run.steps())


def test_signal_received_and_signal_timeout(h: Harness) -> None:
    @h.workflow
    def approval(ctx: Context, timeout: float) -> Any:
        try:
            return ctx.wait_for_signal("approve", timeout=timeout)
        except SignalTimeoutError:
            return "timed out"

    waiting = approval.start(30)
    lapsing = approval.start(0.1)
    h.engine.send_signal(waiting.run_id, "approve", {"by": "alice"})
    h.run()
    assert waiting.wait(timeout=5) == {"by": "alice"}
    assert lapsing.wait(timeout=5) == "timed out"
    with pytest.raises(RunSettledError):
        h.engine.send_signal(waiting.run_id, "approve", {"by": "bob"})


def test_a_signal_sent_before_the_wait_is_kept(h: Harness) -> None:
    @h.task
    def slow() -> int:
        return 1

    @h.workflow
    def wf(ctx: Context) -> Any:
        ctx.step("first", slow)
        payload = ctx.wait_for_signal("go")
        ctx.step("second", slow)  # a later replay reads the recorded payload
        return payload

    run = wf.start()
    h.engine.send_signal(run.run_id, "go", 42)
    h.run()
    assert run.wait(timeout=5) == 42


def test_cancellation_ends_the_run_and_its_child(h: Harness) -> None:
    @h.workflow(name="forever")
    def forever(ctx: Context) -> None:
        ctx.wait_for_signal("never")

    @h.workflow
    def parent(ctx: Context) -> Any:
        return ctx.child("kid", forever)

    run = parent.start()
    h.run()
    child_id = run.steps()[0].step.child_run_id
    assert child_id is not None
    assert run.status() == RunStatus.RUNNING
    run.cancel()
    h.run()
    with pytest.raises(WorkflowCancelledError):
        run.wait(timeout=5)
    assert h.engine.handle(child_id).status() == RunStatus.CANCELLED
    with pytest.raises(RunSettledError):
        run.cancel()


def test_idempotent_start_returns_the_first_run(h: Harness) -> None:
    @h.task
    def once() -> int:
        return h.count("once")

    @h.workflow
    def wf(ctx: Context, x: int) -> Any:
        return ctx.step("once", once)

    first = wf.start(1, idempotency_key="order-7")
    second = wf.start(1, idempotency_key="order-7")
    other = wf.start(1, idempotency_key="order-8")
    h.run()
    assert first.run_id == second.run_id != other.run_id
    assert first.wait(timeout=5) == 1
    assert h.calls["once"] == 2  # order-7 once, order-8 once


def test_an_idempotency_key_reused_with_another_input_is_refused(h: Harness) -> None:
    @h.workflow
    def wf(ctx: Context, order: dict[str, int]) -> Any:
        return order

    first = wf.start({"id": 7, "cents": 1999}, idempotency_key="order-7")
    runs_before = h.engine.store.list_runs()
    with pytest.raises(IdempotencyKeyReusedError) as refused:
        wf.start({"id": 7, "cents": 2999}, idempotency_key="order-7")
    assert refused.value.run_id == first.run_id and refused.value.key == "order-7"
    assert first.run_id in str(refused.value) and "different input" in str(refused.value)
    assert h.engine.store.list_runs() == runs_before  # nothing written
    # The same input gets the same run back; tuples and lists are the same JSON.
    assert wf.start({"cents": 1999, "id": 7}, idempotency_key="order-7").run_id == first.run_id


def test_reordered_steps_fail_the_run_as_nondeterministic(h: Harness) -> None:
    flip = {"order": ["a", "b"]}

    @h.task
    def noop() -> None:
        return None

    @h.workflow
    def wf(ctx: Context) -> None:
        for name in flip["order"]:
            ctx.step(name, noop)

    run = wf.start()
    h.dispatcher.run_until_idle(max_messages=1)  # step "a" ran and "b" is in flight
    flip["order"] = ["b", "a"]
    release_all()  # a deploy: the new code's worker holds no parked body, so it replays
    h.run()
    with pytest.raises(WorkflowFailedError) as info:
        run.wait(timeout=5)
    assert info.value.error["type"] == "WorkflowNondeterminismError"
    assert "'b'" in info.value.error["message"] and "'a'" in info.value.error["message"]


def test_a_duplicate_step_name_fails_the_run(h: Harness) -> None:
    @h.task
    def noop() -> None:
        return None

    @h.workflow
    def wf(ctx: Context) -> None:
        ctx.step("same", noop)
        ctx.step("same", noop)

    run = wf.start()
    h.run()
    with pytest.raises(WorkflowFailedError) as info:
        run.wait(timeout=5)
    assert info.value.error["type"] == "WorkflowNondeterminismError"
    assert "used twice" in info.value.error["message"]


def test_non_json_input_and_arguments_are_refused_at_the_boundary(h: Harness) -> None:
    @h.task
    def noop(x: Any) -> None:
        return None

    @h.workflow
    def wf(ctx: Context, value: Any) -> None:
        ctx.step("s", noop, {"when": value})

    with pytest.raises(PayloadError, match=r"input\['order'\]\['at'\] is a datetime"):
        wf.start({"order": {"at": datetime.now(UTC)}})
    assert h.engine.store.list_runs(workflow=wf.name) == []
    run = wf.start(3)  # JSON input; the argument check happens at dispatch
    h.run()
    assert run.wait(timeout=5) is None
    with pytest.raises(UnknownWorkflowError):
        h.engine.start("no.such.workflow")


def test_non_json_step_argument_fails_the_run_naming_the_path(h: Harness) -> None:
    @h.task
    def noop(x: Any) -> None:
        return None

    @h.workflow
    def wf(ctx: Context) -> None:
        ctx.step("s", noop, {"when": {1, 2}})

    run = wf.start()
    with pytest.raises(WorkflowFailedError, match=r"args\[0\]\['when'\] is a set"):
        run.wait(timeout=5)
    assert run.steps() == []


def test_an_unknown_task_fails_the_run_with_a_clear_error(h: Harness) -> None:
    @h.workflow
    def wf(ctx: Context) -> None:
        ctx.step("s", "no.such.task")

    run = wf.start()
    with pytest.raises(WorkflowFailedError, match="not a registered task"):
        run.wait(timeout=5)
    assert UnknownTaskError.__name__ == run.state().error["type"]  # type: ignore[index]


def test_a_settled_runs_messages_are_no_ops(h: Harness) -> None:
    @h.task
    def one() -> int:
        return h.count("one")

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("one", one)

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == 1
    state = run.state()
    step = run.steps()[0].step
    h.dispatcher.send_step(step)  # a redelivered step message
    h.dispatcher.wake_run(run.run_id)  # a late wake-up
    h.run()
    assert h.calls["one"] == 1
    assert run.state() == state


def test_a_run_whose_lease_is_held_is_rewoken_not_failed(h: Harness) -> None:
    @h.task
    def one() -> int:
        return 1

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("one", one)

    run = wf.start()
    h.dispatcher.messages.clear()  # lose the step message; only a wake-up remains
    with hold_lease(h.engine.leases, f"workflow-run:{run.run_id}", 30, holder="elsewhere"):
        h.engine.orchestrate(run.run_id, "test")
        (rewake,) = h.dispatcher.messages
        assert rewake.kind == "run" and rewake.run_id == run.run_id
        assert run.status() == RunStatus.RUNNING
    h.dispatcher.messages.clear()
    h.engine.store.mark_scheduled([])
    h.engine.orchestrate(run.run_id, "test")
    # The pass found the step scheduled; the sweep re-sends lost messages.
    h.engine.message_grace = 0
    h.engine.sweep()
    h.run()
    assert run.wait(timeout=5) == 1


def test_wait_wakes_when_the_run_settles_elsewhere(h: Harness) -> None:
    @h.task
    def one() -> int:
        return 1

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("one", one)

    run = wf.start()
    outcome: list[Any] = []
    waiter = threading.Thread(target=lambda: outcome.append(run.wait(timeout=10)))
    waiter.start()
    h.run()  # the run settles in this thread while the waiter blocks
    waiter.join(10)
    assert outcome == [1]
