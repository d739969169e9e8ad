"""Changing a workflow with runs in flight: versions, patch markers, pinning.

A deploy is two engines on one store: the old code's, then the new code's
(each with its own registry, as two worker processes would have).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pikku_celery import UnknownPatchError, UnknownWorkflowVersionError, WorkflowFailedError
from pikku_celery.engine import Context, Workflow
from pikku_celery.engine.versions import HASH_PREFIX, source_version, version_order
from pikku_celery.errors import PayloadError
from pikku_celery.model.values import NewRun
from pikku_celery.store import InMemoryWorkflowStore, RunStatus, WorkflowStore

from .conftest import Harness, make_harness

NAME = "fulfil_order"


def deploy(store: WorkflowStore) -> Harness:
    """A worker's engine on ``store`` with the tasks every version uses."""
    h = make_harness(store)
    for step in ("a", "b", "b2", "c", "x", "d"):
        h.task(name=f"t.{step}")(lambda *args, _s=step: _s)
    return h


def old_body(ctx: Context, _: Any = None) -> list[Any]:
    done = [ctx.step("a", "t.a"), ctx.step("b", "t.b"), ctx.step("c", "t.c")]
    ctx.wait_for_signal("go")
    return [*done, ctx.step("d", "t.d")]


def new_body(ctx: Context, _: Any = None) -> list[Any]:
    """The change: 'x' inserted before 'b', 'b' renamed 'b2', 'c' removed."""
    done = [ctx.step("a", "t.a"), ctx.step("x", "t.x"), ctx.step("b2", "t.b2")]
    ctx.wait_for_signal("go")
    return [*done, ctx.step("d", "t.d")]


def patched_body(ctx: Context, _: Any = None) -> list[Any]:
    done = [ctx.step("a", "t.a")]
    if ctx.patched("insert-x"):
        done.append(ctx.step("x", "t.x"))
    done.append(ctx.step("b2", "t.b2") if ctx.patched("rename-b") else ctx.step("b", "t.b"))
    if not ctx.patched("remove-c"):
        done.append(ctx.step("c", "t.c"))
    ctx.wait_for_signal("go")
    return [*done, ctx.step("d", "t.d")]


def register(
    h: Harness, body: Callable[..., Any], version: str | None = None, name: str = NAME
) -> Workflow:
    return h.engine.workflow(body, name=name, version=version)


def parked_old_run(
    store: WorkflowStore, version: str | None = None, name: str = NAME
) -> tuple[Harness, str]:
    """A run of the old code waiting for its signal after a, b and c."""
    old = deploy(store)
    run = register(old, old_body, version, name).start()
    old.run()
    assert [s.step.name for s in run.steps()] == ["a", "b", "c", "signal:go"]
    return old, run.run_id


def finish(h: Harness, run_id: str) -> Any:
    h.engine.send_signal(run_id, "go")
    h.run()
    return h.engine.handle(run_id).wait(timeout=5)


def names(h: Harness, run_id: str) -> list[str]:
    return [s.step.name for s in h.engine.handle(run_id).steps()]


def test_a_run_records_the_version_it_started_on(store: WorkflowStore) -> None:
    h = deploy(store)
    hashed = register(h, old_body)
    run = hashed.start()
    assert run.state().workflow_version == source_version(old_body) == hashed.version
    assert hashed.version.startswith(HASH_PREFIX) and not hashed.pinned
    other = deploy(store)
    pinned = other.engine.workflow(new_body, name="other", version="7")
    assert pinned.start().state().workflow_version == "7" and pinned.pinned
    for harness in (h, other):  # no step left for another test's sweep (a shared database)
        harness.run()


def test_the_source_hash_ignores_comments_formatting_and_the_docstring() -> None:
    def spelt_once(ctx: Context) -> Any:
        return ctx.step("a", "t.a")

    def spelt_twice(ctx: Context) -> Any:
        """Docs."""
        # a comment

        return ctx.step(
            "a",
            "t.a",
        )

    def edited(ctx: Context) -> Any:
        return ctx.step("a", "t.b")

    assert source_version(spelt_once) == source_version(spelt_twice)
    assert source_version(spelt_once) != source_version(edited)
    namespace: dict[str, Any] = {}
    exec(  # a body with no source file to read
        "def made(ctx):\n    return ctx.step('a', 't.a')\n"
        "def changed(ctx):\n    return ctx.step('a', 't.b')\n",
        namespace,
    )
    # Hashed from its compiled code instead: still told apart from an edit.
    made, changed = source_version(namespace["made"]), source_version(namespace["changed"])
    assert made.startswith(HASH_PREFIX) and made != changed


def test_patched_lets_an_old_run_finish_on_its_old_path_and_a_new_run_take_the_new(
    store: WorkflowStore,
) -> None:
    _, old_run = parked_old_run(store)
    new = deploy(store)
    flow = register(new, patched_body)
    assert finish(new, old_run) == ["a", "b", "c", "d"]
    assert names(new, old_run) == ["a", "b", "c", "signal:go", "d"]

    fresh = flow.start()
    new.run()
    assert finish(new, fresh.run_id) == ["a", "x", "b2", "d"]
    assert names(new, fresh.run_id) == [
        "a",
        "patch:insert-x",
        "x",
        "patch:rename-b",
        "b2",
        "patch:remove-c",
        "signal:go",
        "d",
    ]
    assert fresh.state().workflow_version == source_version(patched_body)


def test_a_run_that_had_not_reached_the_change_takes_the_new_path(store: WorkflowStore) -> None:
    old = deploy(store)

    def before(ctx: Context) -> list[Any]:
        first = ctx.step("a", "t.a")
        ctx.wait_for_signal("go")
        return [first, ctx.step("b", "t.b")]

    def after(ctx: Context) -> list[Any]:
        first = ctx.step("a", "t.a")
        ctx.wait_for_signal("go")
        return [first, ctx.step("b2", "t.b2") if ctx.patched("rename-b") else ctx.step("b", "t.b")]

    run = old.engine.workflow(before, name=NAME).start()
    old.run()
    new = deploy(store)
    new.engine.workflow(after, name=NAME)
    assert finish(new, run.run_id) == ["a", "b2"]


def test_a_worker_on_code_before_the_patch_leaves_a_patched_run_to_newer_code(
    store: WorkflowStore,
) -> None:
    """A rolling deploy: a run the patched code started (its markers recorded)
    reaches a worker still on the old code, which neither fails it nor
    replays it, but leaves it, blocked, to a worker that knows the patch."""
    patched = deploy(store)
    run = register(patched, patched_body).start()
    patched.run()
    assert names(patched, run.run_id)[:2] == ["a", "patch:insert-x"]
    behind = deploy(store)
    register(behind, old_body)
    behind.engine.send_signal(run.run_id, "go")
    with pytest.raises(UnknownPatchError):
        behind.engine.orchestrate(run.run_id)
    state = run.state()
    assert state.status == RunStatus.RUNNING and "patch:insert-x" in (state.blocked or "")
    assert [m.reason for m in behind.dispatcher.messages if m.kind == "run"][-1] == "blocked#0"
    patched.engine.orchestrate(run.run_id)
    patched.run()
    assert run.wait(timeout=5) == ["a", "x", "b2", "d"]


def test_patched_answers_the_same_when_asked_twice(store: WorkflowStore) -> None:
    h = deploy(store)

    @h.engine.workflow(name="twice")
    def twice(ctx: Context) -> list[bool]:
        first = ctx.patched("p")
        ctx.step("a", "t.a")
        return [first, ctx.patched("p")]

    run = twice.start()
    h.run()
    assert run.wait(timeout=5) == [True, True]
    assert [s.step.name for s in run.steps()] == ["patch:p", "a"]


def test_deprecate_patch_replays_runs_with_the_marker_and_records_none_for_new_ones(
    store: WorkflowStore,
) -> None:
    patched = deploy(store)
    with_marker = register(patched, patched_body).start()
    patched.run()
    assert "patch:rename-b" in names(patched, with_marker.run_id)

    def deprecated(ctx: Context, _: Any = None) -> list[Any]:
        done = [ctx.step("a", "t.a")]
        ctx.deprecate_patch("insert-x")
        done.append(ctx.step("x", "t.x"))
        ctx.deprecate_patch("rename-b")
        done.append(ctx.step("b2", "t.b2"))
        ctx.deprecate_patch("remove-c")
        ctx.wait_for_signal("go")
        return [*done, ctx.step("d", "t.d")]

    later = deploy(store)
    flow = register(later, deprecated)
    assert finish(later, with_marker.run_id) == ["a", "x", "b2", "d"]
    fresh = flow.start()
    later.run()
    assert finish(later, fresh.run_id) == ["a", "x", "b2", "d"]
    assert names(later, fresh.run_id) == ["a", "x", "b2", "signal:go", "d"]


def test_both_versions_registered_each_run_replays_on_its_own(store: WorkflowStore) -> None:
    _, old_run = parked_old_run(store, version="1")
    both = deploy(store)
    register(both, new_body, "2")
    register(both, old_body, "1")  # registration order does not decide "newest"
    assert both.engine.registry.get(NAME).version == "2"
    fresh = both.engine.registry.get(NAME).start()
    both.run()
    assert fresh.state().workflow_version == "2"
    assert finish(both, old_run) == ["a", "b", "c", "d"]
    assert finish(both, fresh.run_id) == ["a", "x", "b2", "d"]


def test_without_either_the_old_run_fails_naming_both_steps(store: WorkflowStore) -> None:
    _, old_run = parked_old_run(store)
    new = deploy(store)
    register(new, new_body)
    with pytest.raises(WorkflowFailedError) as failed:
        finish(new, old_run)
    error = failed.value.error or {}
    assert error["type"] == "WorkflowNondeterminismError"
    assert "'x'" in error["message"] and "'b'" in error["message"], error["message"]


def test_a_worker_without_a_run_s_pinned_version_leaves_it_to_one_that_has_it(
    store: WorkflowStore,
) -> None:
    old, run_id = parked_old_run(store, version="1")
    newer = deploy(store)
    register(newer, new_body, "2")  # this worker has only version 2
    newer.engine.send_signal(run_id, "go")
    with pytest.raises(UnknownWorkflowVersionError):
        newer.engine.orchestrate(run_id)
    state = newer.engine.handle(run_id).state()
    assert state.status == RunStatus.RUNNING
    assert state.blocked is not None and "version '1'" in state.blocked
    assert names(newer, run_id) == ["a", "b", "c", "signal:go"]  # nothing replayed
    # The signal's wake-up is spent: the run is asked again later, backing off.
    [again] = [m for m in newer.dispatcher.messages if m.reason.startswith("blocked")]
    assert (again.run_id, again.reason) == (run_id, "blocked#0")
    with pytest.raises(UnknownWorkflowVersionError):
        newer.engine.orchestrate(run_id, again.reason)
    waits = sorted(m.due for m in newer.dispatcher.messages if m.reason == "blocked#1")
    assert len(waits) == 1 and waits[0] - again.due >= newer.engine.sweep_backoff
    old.engine.orchestrate(run_id)  # a worker with version 1 takes it
    old.run()
    assert old.engine.handle(run_id).wait(timeout=5) == ["a", "b", "c", "d"]
    assert old.engine.handle(run_id).state().blocked is None


def test_a_step_finished_by_a_worker_without_the_run_s_version_keeps_its_outcome(
    store: WorkflowStore,
) -> None:
    old = deploy(store)
    run = register(old, old_body, "1").start()  # step 'a' is sent, not yet run
    newer = deploy(store)
    register(newer, new_body, "2")
    [message] = old.dispatcher.messages
    old.dispatcher.messages.clear()
    newer.dispatcher.deliver(message)  # its worker has the task but not version 1
    [a] = run.steps()
    assert a.step.status.value == "succeeded" and a.step.result == "a"
    assert run.state().blocked is not None
    old.engine.orchestrate(run.run_id)
    old.run()
    assert names(old, run.run_id) == ["a", "b", "c", "signal:go"]


def test_a_run_recorded_before_versions_replays_on_the_newest_version_that_fits(
    store: WorkflowStore,
) -> None:
    old = deploy(store)
    register(old, old_body)
    # A run from before versions were recorded has none (its column is NULL).
    legacy, _ = store.create_run(NewRun(workflow=NAME, input=None))
    assert legacy.workflow_version is None
    old.engine.orchestrate(legacy.id)
    old.run()
    assert names(old, legacy.id) == ["a", "b", "c", "signal:go"]
    both = deploy(store)
    register(both, old_body, "1")
    register(both, new_body, "2")
    assert finish(both, legacy.id) == ["a", "b", "c", "d"]  # version 2 diverges, 1 fits
    fresh, _ = store.create_run(NewRun(workflow=NAME, input=None))
    both.engine.orchestrate(fresh.id)
    both.run()
    assert finish(both, fresh.id) == ["a", "x", "b2", "d"]  # nothing recorded: the newest


def test_versions_are_checked_and_ordered_as_people_number_them() -> None:
    ordered = sorted(["10", "9", "1.10", "1.9", "2", "2a"], key=version_order)
    assert ordered == ["1.9", "1.10", "2", "2a", "9", "10"]
    h = make_harness(InMemoryWorkflowStore())
    for bad in ("", "src:abc", "x" * 65):
        with pytest.raises(PayloadError):
            h.engine.workflow(old_body, name="bad", version=bad)
    assert h.engine.workflow(old_body, name="int", version=3).version == "3"


def test_the_registry_refuses_ambiguous_bodies() -> None:
    h = make_harness(InMemoryWorkflowStore())
    h.engine.workflow(old_body, name=NAME, version="1")
    with pytest.raises(ValueError, match="version '1'"):
        h.engine.workflow(new_body, name=NAME, version="1")
    with pytest.raises(ValueError, match="give every body"):
        h.engine.workflow(new_body, name=NAME)
    h.engine.workflow(old_body, name="plain")
    with pytest.raises(ValueError, match="already registered as 'plain'"):
        h.engine.workflow(new_body, name="plain")
    with pytest.raises(ValueError, match="give every body"):
        h.engine.workflow(new_body, name="plain", version="2")
