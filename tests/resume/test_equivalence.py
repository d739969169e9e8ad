"""A resumed pass decides what a replay of the same view decides, for every shape of body.

Each pass of each run below is decided twice over the same view: by the body
this thread holds parked (or a fresh one), and by a replay from the top; the
two decisions must be equal, and most passes must have resumed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery.engine import Context, WorkflowEngine
from pikku_celery.errors import StepFailedError, WorkflowFailedError
from pikku_celery.sql.schema import metadata
from pikku_celery.store.sql_for import store_for
from pikku_celery.testing import InlineDispatcher, make_engine

from .conftest import Passes


@pytest.fixture(params=["eager", "broker", "postgres-eager", "postgres-broker"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[WorkflowEngine, InlineDispatcher]]:
    """The memory store (its views reuse unchanged steps) and PostgreSQL (every
    view is read anew), with eager steps and with every step a message."""
    inline = InlineDispatcher(eager=request.param.endswith("eager"))
    if not request.param.startswith("postgres"):
        yield make_engine(dispatcher=inline)
        return
    sql = request.getfixturevalue("postgres_engine")
    metadata.create_all(sql)
    store = store_for(sql)
    yield make_engine(store, inline)
    store.close()


def settled(passes: Passes, at_least: int) -> None:
    assert passes.mismatches == []
    assert passes.resumed >= at_least, passes


def test_sequential_steps_events_values_and_patches(
    engine: tuple[WorkflowEngine, InlineDispatcher], passes: Passes
) -> None:
    wf, inline = engine

    @inline.task
    def inc(x: int) -> int:
        return x + 1

    @wf.workflow(name="seq")
    def seq(ctx: Context, n: int) -> Any:
        x = 0
        for i in range(n):
            x = ctx.step(f"s{i}", inc, x)
            ctx.set_event("progress", i)
            if ctx.patched("extra"):
                x += 100
            ctx.now()
        return x

    run = seq.start(8)
    inline.run_until_idle()
    assert run.wait(timeout=5) == 808
    settled(passes, at_least=6)


def test_gather_of_steps_and_children(
    engine: tuple[WorkflowEngine, InlineDispatcher], passes: Passes
) -> None:
    wf, inline = engine

    @inline.task
    def double(x: int) -> int:
        return 2 * x

    @wf.workflow(name="leaf")
    def leaf(ctx: Context, x: int) -> int:
        return int(ctx.step("d", double, x))

    @wf.workflow(name="fan")
    def fan(ctx: Context) -> Any:
        steps = [ctx.step_async(f"s{i}", double, i) for i in range(6)]
        kids = [ctx.child_async(f"c{i}", leaf, i) for i in range(3)]
        return sum(ctx.gather(*steps)) + sum(ctx.gather(*kids))

    run = fan.start()
    inline.run_until_idle()
    assert run.wait(timeout=5) == 30 + 6
    settled(passes, at_least=3)


def test_timers_signals_and_their_timeouts(
    engine: tuple[WorkflowEngine, InlineDispatcher], passes: Passes
) -> None:
    wf, inline = engine

    @inline.task
    def one() -> int:
        return 1

    @wf.workflow(name="waits")
    def waits(ctx: Context) -> Any:
        a = ctx.step("a", one)
        ctx.sleep("nap", 0.02)
        got = ctx.wait_for_signal("go")
        try:
            ctx.wait_for_signal("never", timeout=0.02)
            late = "came"
        except Exception as exc:
            late = type(exc).__name__
        return [a + ctx.step("b", one), got, late]

    run = waits.start()
    inline.run_until_idle()
    wf.send_signal(run.run_id, "go", {"v": 1})
    inline.run_until_idle()
    assert run.wait(timeout=5) == [2, {"v": 1}, "SignalTimeoutError"]
    settled(passes, at_least=3)


def test_failures_retries_and_compensation(
    engine: tuple[WorkflowEngine, InlineDispatcher], passes: Passes
) -> None:
    wf, inline = engine
    calls = {"flaky": 0}

    @inline.task
    def flaky(x: int) -> int:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ConnectionError("busy")
        return x

    @inline.task
    def broken() -> None:
        raise ValueError("no")

    @wf.workflow(name="failing")
    def failing(ctx: Context) -> Any:
        x = ctx.step("flaky", flaky, 5, retries=3, retry_delay=0)
        try:
            ctx.step("broken", broken)
        except StepFailedError as exc:
            return [x, exc.error_type]
        return [x, None]

    run = failing.start()
    inline.run_until_idle()
    assert run.wait(timeout=5) == [5, "ValueError"]
    settled(passes, at_least=2)


def test_a_name_reached_twice_fails_the_run_as_a_replay_would(
    engine: tuple[WorkflowEngine, InlineDispatcher], passes: Passes
) -> None:
    wf, inline = engine

    @inline.task
    def one() -> int:
        return 1

    @wf.workflow(name="twice")
    def twice(ctx: Context) -> Any:
        ctx.step("a", one)
        ctx.step("b", one)
        return ctx.step("a", one)

    run = twice.start()
    inline.run_until_idle()
    with pytest.raises(WorkflowFailedError) as failed:
        run.wait(timeout=5)
    assert failed.value.error["type"] == "WorkflowNondeterminismError"
    settled(passes, at_least=1)
