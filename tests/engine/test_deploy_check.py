"""The deploy check: runs in flight replayed on new code, nothing written.

The engine's PostgreSQL store is shared by the session's tests, so each test
names its own workflow and checks only its runs.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from pikku_celery.engine import Context
from pikku_celery.engine.deploy_check import DeployCheck, check_deploy
from pikku_celery.sql.schema import metadata
from pikku_celery.store import WorkflowStore
from pikku_celery.store.sql_for import store_for

from .conftest import Harness
from .test_versions import deploy, new_body, old_body, parked_old_run, patched_body


def own_name() -> str:
    return f"fulfil-{uuid.uuid4().hex[:8]}"


def check(h: Harness, name: str, page: int = 500) -> DeployCheck:
    return check_deploy(h.engine, page=page, workflows={name})


def test_a_diverging_run_is_listed_with_the_step_recorded_and_the_step_reached(
    store: WorkflowStore,
) -> None:
    name = own_name()
    _, run_id = parked_old_run(store, name=name)
    new = deploy(store)
    new.engine.workflow(new_body, name=name)
    report = check(new, name)
    assert report.checked == 1 and not report.ok
    [found] = report.failing
    assert (found.run_id, found.problem, found.index) == (run_id, "diverges", 1)
    assert found.recorded == ("task", "b") and found.reached == ("task", "x")
    assert found.error_type == "WorkflowNondeterminismError"
    assert found.version is not None and found.version != found.replays_on
    assert report.versions == {(name, found.version): 1}


def test_runs_that_patched_code_carries_on_are_not_listed(store: WorkflowStore) -> None:
    name = own_name()
    parked_old_run(store, name=name)
    patched = deploy(store)
    patched.engine.workflow(patched_body, name=name)
    report = check(patched, name)
    assert report.checked == 1 and report.ok


def test_a_pinned_run_without_its_version_here_is_listed_blocked(store: WorkflowStore) -> None:
    name = own_name()
    _, run_id = parked_old_run(store, version="1", name=name)
    newer = deploy(store)
    newer.engine.workflow(new_body, name=name, version="2")
    [found] = check(newer, name).failing
    assert (found.run_id, found.problem, found.replays_on) == (run_id, "blocked", None)
    assert "version '1'" in found.message
    both = deploy(store)
    both.engine.workflow(new_body, name=name, version="2")
    both.engine.workflow(old_body, name=name, version="1")
    assert check(both, name).ok


def test_a_body_that_raises_on_replay_is_listed_as_failing(store: WorkflowStore) -> None:
    name = own_name()
    _, run_id = parked_old_run(store, name=name)
    broken = deploy(store)

    @broken.engine.workflow(name=name)
    def raises(ctx: Context, _: Any = None) -> Any:
        ctx.step("a", "t.a")
        raise KeyError("order")

    [found] = check(broken, name).failing
    assert (found.run_id, found.problem, found.error_type) == (run_id, "fails", "KeyError")


def test_the_check_reads_every_page(store: WorkflowStore) -> None:
    name = own_name()
    old = deploy(store)
    flow = old.engine.workflow(old_body, name=name)
    started = {flow.start().run_id for _ in range(7)}
    old.run()
    new = deploy(store)
    new.engine.workflow(new_body, name=name)
    report = check(new, name, page=3)
    assert report.checked == 7 and {f.run_id for f in report.failing} == started


def test_the_check_writes_nothing(postgres_engine: sa.Engine) -> None:
    """Every statement the check sends (seen by SQLAlchemy's cursor hook) is a
    SELECT, and the runs are as they were."""
    metadata.create_all(postgres_engine)
    store = store_for(postgres_engine)
    name = own_name()
    runs = [parked_old_run(store, name=name)[1] for _ in range(3)]
    before = [store.get_run(r) for r in runs]
    new = deploy(store)
    new.engine.workflow(new_body, name=name)
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(postgres_engine, "before_cursor_execute", note)
    try:
        report = check(new, name, page=2)
    finally:
        sa.event.remove(postgres_engine, "before_cursor_execute", note)
    assert report.checked == 3 and len(report.failing) == 3
    assert seen, "the listener saw no statement"
    assert all(s.lstrip().upper().startswith("SELECT") for s in seen), seen
    assert [store.get_run(r) for r in runs] == before


def test_dropping_a_patch_while_runs_hold_its_marker_is_listed(store: WorkflowStore) -> None:
    name = own_name()
    patched = deploy(store)
    run = patched.engine.workflow(patched_body, name=name).start()
    patched.run()  # its history: a, patch:insert-x, x, ...
    cleaned = deploy(store)
    cleaned.engine.workflow(new_body, name=name)  # the patch calls removed
    [found] = check(cleaned, name).failing
    assert (found.run_id, found.index, found.problem) == (run.run_id, 1, "blocked")
    assert found.recorded == ("value", "patch:insert-x") and found.reached == ("task", "x")
    assert found.error_type == "UnknownPatchError"
