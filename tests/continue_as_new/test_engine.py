"""continue_as_new in a workflow body, on an engine over every store."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.errors import WorkflowFailedError, WorkflowLimitError
from pikku_celery.store import RunStatus, WorkflowStore
from tests.engine.conftest import Harness, make_harness


def counter(h: Harness, per_run: int = 3) -> Any:
    @h.task
    def bump(n: int) -> int:
        return n + 1

    @h.workflow
    def count_to(ctx: Context, state: dict[str, int]) -> int:
        n = state["n"]
        for i in range(per_run):
            n = ctx.step(f"bump-{i}", bump, n)
            if n >= state["until"]:
                return n
        ctx.continue_as_new({"n": n, "until": state["until"]})

    return count_to


def test_a_run_continues_as_new_until_done_and_wait_follows_the_chain(h: Harness) -> None:
    first = counter(h).start({"n": 0, "until": 10})
    h.run()

    assert first.wait(timeout=10) == 10  # followed to the last run
    state = first.state()
    assert state.status == RunStatus.COMPLETED and state.output is None
    assert first.wait(timeout=10, follow=False) is None
    chain = [first]
    while (nxt := chain[-1].successor()) is not None:
        chain.append(nxt)
    assert len(chain) == 4  # 3 + 3 + 3 + 1 steps
    assert [len(c.steps()) for c in chain] == [3, 3, 3, 1]
    assert chain[-1].result() == 10 and first.result() == 10
    assert first.latest().run_id == chain[-1].run_id
    # every link is kept both ways
    for before, after in itertools.pairwise(chain):
        back = after.predecessor()
        assert back is not None and back.run_id == before.run_id
        assert after.state().input["until"] == 10
    assert first.predecessor() is None
    # a pass taken again on any run of the chain (a redelivered message) starts nothing
    for handle in chain:
        h.engine.orchestrate(handle.run_id, "redelivered")
    h.run()
    assert len(h.engine.store.list_runs(workflow=first.state().workflow)) == 4


def test_a_failing_successor_fails_the_followed_wait(h: Harness) -> None:
    @h.workflow
    def once_then_fail(ctx: Context, again: bool) -> None:
        if again:
            ctx.continue_as_new(False)
        raise RuntimeError("second run fails")

    run = once_then_fail.start(True)
    h.run()
    with pytest.raises(WorkflowFailedError, match="second run fails"):
        run.wait(timeout=10)
    assert run.state().status == RunStatus.COMPLETED


def test_a_body_cannot_swallow_the_continuation(h: Harness) -> None:
    @h.workflow
    def stubborn(ctx: Context, n: int) -> int:
        if n == 0:
            try:
                ctx.continue_as_new(1)
            except Exception:
                return -1
        return n

    run = stubborn.start(0)
    h.run()
    assert run.wait(timeout=10) == 1


def test_a_child_run_is_refused(h: Harness) -> None:
    @h.workflow
    def inner(ctx: Context) -> None:
        ctx.continue_as_new(None)

    @h.workflow
    def outer(ctx: Context) -> Any:
        return ctx.child("inner", inner)

    run = outer.start()
    h.run()
    with pytest.raises(WorkflowFailedError, match="continue_as_new is for runs started by start"):
        run.wait(timeout=10)


def test_the_step_limit_names_continue_as_new(store: WorkflowStore) -> None:
    hh = make_harness(store, max_steps_per_run=2)
    loop = counter(hh, per_run=5)
    run = loop.start({"n": 0, "until": 100})
    hh.run()
    with pytest.raises(WorkflowFailedError) as failed:
        run.wait(timeout=10)
    assert "ctx.continue_as_new" in str(failed.value)
    assert WorkflowLimitError.__name__ in str(failed.value.error)


def test_a_run_may_continue_as_another_workflow(h: Harness) -> None:
    @h.workflow(name="tally")
    def tally(ctx: Context, n: int) -> str:
        return f"tallied {n}"

    @h.workflow(name="collect")
    def collect(ctx: Context, n: int) -> None:
        ctx.continue_as_new(n * 2, workflow=tally)

    run = collect.start(21)
    h.run()
    assert run.wait(timeout=10) == "tallied 42"
    latest = run.latest().state()
    assert latest.workflow == "tally" and latest.continued_from == run.run_id


def test_an_input_that_is_not_json_fails_the_run_and_starts_nothing(h: Harness) -> None:
    @h.workflow
    def bad(ctx: Context) -> None:
        ctx.continue_as_new({"when": object()})

    run = bad.start()
    h.run()
    with pytest.raises(WorkflowFailedError, match="continue_as_new"):
        run.wait(timeout=10)
    assert run.state().continued_as is None and run.successor() is None
