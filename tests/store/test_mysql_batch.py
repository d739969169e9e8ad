"""MariaDB: claims and outcomes as one multi-statement round trip, and the
one-statement-per-round-trip path for engines without the client flag.

The conformance suite runs on the batched path (engines from ``make_engine``);
here the same fencing rules are checked on both, and the pool's skipped
ROLLBACK is shown never to leak a half-done batch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pikku_celery.errors import WorkflowStepFunctionMismatchError, WorkflowStepSupersededError
from pikku_celery.sql.mysql_batch import Batch, in_transaction, run_batch
from pikku_celery.sql.schema import step_table
from pikku_celery.store import AttemptStatus, StepStatus
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for
from pikku_celery.store.sql_mysql import MySQLWorkflowStore
from tests.store.conftest import wipe
from tests.store.support import LONG, SHORT, TASK, lapse, make_tasks


@pytest.fixture(params=["batched-inline", "batched-session-variable", "one-by-one"])
def mysql_store(
    request: pytest.FixtureRequest, store_mysql_engine: sa.Engine
) -> Iterator[MySQLWorkflowStore]:
    """MariaDB's batches read ROW_COUNT() inline; MySQL's keep it in a session
    variable first: both forms run here on MariaDB."""
    wipe(store_mysql_engine)
    if request.param.startswith("batched"):
        store = MySQLWorkflowStore(store_mysql_engine)
        store.prepare()  # learns that the connection takes batches
        assert store.batched
        if request.param == "batched-session-variable":
            store.use_batches(inline_row_count=False)
        yield store
        return
    plain = sa.create_engine(store_mysql_engine.url, pool_size=2)
    try:
        unbatched = MySQLWorkflowStore(plain)
        unbatched.prepare()
        assert not unbatched.batched
        yield unbatched
    finally:
        plain.dispose()


def test_engines_from_make_engine_batch_and_plain_ones_do_not(
    store_mysql_engine: sa.Engine,
) -> None:
    plain = sa.create_engine(store_mysql_engine.url)
    try:
        batched, unbatched = store_for(store_mysql_engine), store_for(plain)
        assert isinstance(batched, MySQLWorkflowStore)
        assert isinstance(unbatched, MySQLWorkflowStore)
        batched.prepare()
        unbatched.prepare()
        assert batched.batched
        assert not unbatched.batched
    finally:
        plain.dispose()


def test_takeover_fencing_on_both_paths(mysql_store: SQLWorkflowStore) -> None:
    store = mysql_store
    run, [step] = make_tasks(store, 1, max_attempts=3)
    with pytest.raises(WorkflowStepFunctionMismatchError):
        store.claim_step(step.id, "tasks.other", "a", LONG)
    first = store.claim_step(step.id, TASK, "a", SHORT)
    assert first is not None and first.attempt == 1 and first.status == StepStatus.RUNNING
    assert store.claim_step(step.id, TASK, "b", LONG) is None
    lapse(store, first)
    second = store.claim_step(step.id, TASK, "b", LONG)
    assert second is not None and second.attempt == 2 and second.worker == "b"

    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, 1, {"stale": True})
    store.complete_step(step.id, 2, {"current": True})
    with pytest.raises(WorkflowStepSupersededError):
        store.complete_step(step.id, 2, {"again": True})

    rows = {a.attempt: a for a in store.get_attempts(run.id)}
    assert rows[1].status == AttemptStatus.SUPERSEDED and rows[1].result is None
    assert rows[2].status == AttemptStatus.SUCCEEDED and rows[2].result == {"current": True}
    done = store.get_step(step.id)
    assert done is not None and done.result == {"current": True}
    assert store.claim_step(step.id, TASK, "c", LONG) is None


def test_failed_attempt_keeps_its_status_when_the_retry_is_claimed(
    mysql_store: SQLWorkflowStore,
) -> None:
    store = mysql_store
    run, [step] = make_tasks(store, 1, max_attempts=2)
    first = store.claim_step(step.id, TASK, "a", LONG)
    assert first is not None
    store.fail_step(step.id, 1, {"type": "E", "message": "boom"}, retry_delay=0.0)
    second = store.claim_step(step.id, TASK, "b", LONG)
    assert second is not None and second.attempt == 2
    rows = {a.attempt: a for a in store.get_attempts(run.id)}
    assert rows[1].status == AttemptStatus.FAILED
    assert rows[2].status == AttemptStatus.RUNNING


def set_worker(worker: str) -> sa.Update:
    """A write a batch leaves visible only if it commits."""
    return (
        sa.update(step_table).where(step_table.c.id == sa.bindparam("p_id")).values(worker=worker)
    )


def test_a_batch_that_fails_half_way_is_rolled_back_before_reuse(
    store_mysql_engine: sa.Engine,
) -> None:
    wipe(store_mysql_engine)
    store = store_for(store_mysql_engine)
    _, [step] = make_tasks(store, 1)
    broken = Batch(
        store_mysql_engine.dialect,
        [set_worker("half-way"), "SELECT * FROM pikku_no_such_table", "COMMIT"],
    )
    with store_mysql_engine.connect() as conn:
        driver = conn.connection.driver_connection
        with pytest.raises(sa.exc.ProgrammingError):
            run_batch(conn, broken, {"p_id": step.id})
    # Rolled back (by SQLAlchemy's error handling) before the pool reuses it.
    assert not in_transaction(driver)
    after = store.get_step(step.id)
    assert after is not None and after.worker is None


def test_a_batch_left_open_is_rolled_back_by_the_pool(store_mysql_engine: sa.Engine) -> None:
    """Only a batch that ended in COMMIT skips the pool's ROLLBACK."""
    wipe(store_mysql_engine)
    store = store_for(store_mysql_engine)
    _, [step] = make_tasks(store, 1)
    open_ended = Batch(store_mysql_engine.dialect, [set_worker("uncommitted")])
    with store_mysql_engine.connect() as conn:
        driver = conn.connection.driver_connection
        run_batch(conn, open_ended, {"p_id": step.id})
        assert in_transaction(driver)
    assert not in_transaction(driver)
    after = store.get_step(step.id)
    assert after is not None and after.worker is None
