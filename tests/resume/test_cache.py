"""The per-thread cache of parked bodies: bounded, evicting changes no outcome,
and a dropped body's ``finally`` blocks run as a replayed one's do."""

from __future__ import annotations

import contextvars
import threading
from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.engine.limits import Limits
from pikku_celery.engine.resume import holding, passes, release_all
from pikku_celery.errors import WorkflowCancelledError
from pikku_celery.testing import InlineDispatcher, make_engine

from .conftest import Passes


def interleaved(runs: int, steps: int, **options: Any) -> tuple[list[Any], list[int]]:
    """``runs`` runs of ``steps`` broker steps each, their passes interleaved."""
    engine, inline = make_engine(dispatcher=InlineDispatcher(), **options)
    ends: list[int] = []

    @inline.task
    def inc(x: int) -> int:
        return x + 1

    @engine.workflow(name="counted")
    def counted(ctx: Context, start: int) -> int:
        x = start
        try:
            for i in range(steps):
                x = ctx.step(f"s{i}", inc, x)
        finally:
            ends.append(start)  # on every pass's end: replayed, finished or dropped
        return x

    handles = [counted.start(100 * r) for r in range(runs)]
    inline.run_until_idle()
    return [h.wait(timeout=5) for h in handles], ends


def test_a_small_cache_changes_no_outcome(passes: Passes) -> None:
    outputs, _ = interleaved(4, 6, resume_max_bodies=1)
    assert outputs == [6, 106, 206, 306]
    assert passes.mismatches == []
    assert passes.replayed > 4  # evicted bodies replayed: more than each run's first pass
    assert len(holding()) <= 1


def test_the_step_bound_evicts_too(passes: Passes) -> None:
    outputs, _ = interleaved(3, 5, resume_max_steps=4)
    assert outputs == [5, 105, 205]
    assert passes.mismatches == []
    assert passes.replayed > 3


def test_a_large_cache_resumes_every_pass_after_the_first() -> None:
    release_all()
    resumed, replayed = passes()
    outputs, ends = interleaved(3, 5)
    assert outputs == [5, 105, 205]
    assert passes()[1] - replayed == 3  # each run's first pass
    assert passes()[0] - resumed == 3 * 5  # every pass after it: one per step
    assert sorted(ends) == [0, 100, 200]  # each body ended once: it returned
    assert holding() == []  # settled runs leave the cache


def test_an_evicted_body_runs_its_finally_blocks() -> None:
    release_all()
    _, ends = interleaved(2, 3, resume_max_bodies=1)
    # Each eviction and each return ends a body once; with one slot the two
    # runs evict each other at every pass, so each ends more than once.
    assert ends.count(0) > 1 and ends.count(100) > 1


def test_a_cancel_drops_the_parked_body() -> None:
    release_all()
    engine, inline = make_engine(dispatcher=InlineDispatcher())
    ended = threading.Event()

    @inline.task
    def one() -> int:
        return 1

    @engine.workflow(name="waiting")
    def waiting(ctx: Context) -> None:
        try:
            ctx.step("a", one)
            ctx.wait_for_signal("never")
        finally:
            ended.set()

    run = waiting.start()
    inline.run_until_idle()
    assert run.run_id in holding()
    ended.clear()  # the first pass (before "a" ran) ended its body too
    engine.cancel(run.run_id)
    inline.run_until_idle()
    with pytest.raises(WorkflowCancelledError):
        run.wait(timeout=5)
    assert ended.is_set()
    assert run.run_id not in holding()


def test_a_body_parked_on_one_thread_is_replayed_on_another() -> None:
    release_all()
    engine, inline = make_engine(dispatcher=InlineDispatcher())

    @inline.task
    def one() -> int:
        return 1

    @engine.workflow(name="signalled")
    def signalled(ctx: Context) -> Any:
        return [ctx.step("a", one), ctx.wait_for_signal("go")]

    run = signalled.start()
    inline.run_until_idle()
    assert run.run_id in holding()
    engine.send_signal(run.run_id, "go", 2)
    counted: list[tuple[int, int]] = []

    def other_thread() -> None:
        before = passes()
        inline.run_until_idle()
        after = passes()
        counted.append((after[0] - before[0], after[1] - before[1]))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join(30)
    assert run.wait(timeout=5) == [1, 2]
    assert counted == [(0, 1)]  # that thread held nothing: it replayed
    release_all()  # this thread's body of the settled run


def test_the_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="resume_max_bodies"):
        Limits(resume_max_bodies=-1)
    assert Limits(resume_max_bodies=0).resume_max_bodies == 0


def test_a_resumed_body_sees_the_context_variables_of_its_pass() -> None:
    release_all()
    engine, inline = make_engine(dispatcher=InlineDispatcher())
    tag: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="none")

    @inline.task
    def one() -> int:
        return 1

    @engine.workflow(name="tagged")
    def tagged(ctx: Context) -> Any:
        seen = [tag.get()]
        ctx.step("a", one)
        seen.append(tag.get())
        ctx.step("b", one)
        return [*seen, tag.get()]

    token = tag.set("pass")
    try:
        run = tagged.start()
        inline.run_until_idle()
    finally:
        tag.reset(token)
    assert run.wait(timeout=5) == ["pass", "pass", "pass"]
