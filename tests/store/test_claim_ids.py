"""Claim ids: a claim the database lost is fenced out, though its attempt number returns.

On PostgreSQL a claim made from a message commits asynchronously; a database
crash may lose it, and the step then reverts to its state before the claim.
The next claim takes the same attempt number with a new claim id, so the
lost claim's body is refused at its first renewal or outcome. Here the loss
is simulated by putting the step row back as it was and deleting the lost
claim's attempt row, on every SQL store; the memory store cannot lose a
claim, and its fencing on the claim id is checked directly.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.engine.passes import take_pass
from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.sql.schema import attempt_table, step_table
from pikku_celery.store import (
    AttemptStatus,
    InMemoryWorkflowStore,
    RunState,
    SQLWorkflowStore,
    StepOutcome,
    StepState,
    StepStatus,
    WorkflowStore,
    store_for,
)
from tests.store.conftest import wipe
from tests.store.support import LONG, claim, make_tasks

ENGINES = {
    "sqlite": "sqlite_engine",
    "postgres": "store_pg_engine",
    "mariadb": "store_mysql_engine",
}


@pytest.fixture(params=sorted(ENGINES))
def sql_store(request: pytest.FixtureRequest) -> SQLWorkflowStore:
    engine: sa.Engine = request.getfixturevalue(ENGINES[request.param])
    store = store_for(engine)
    store.prepare()  # SQLite: makes the tables
    wipe(engine)
    return store


def lose_claim(store: SQLWorkflowStore, step_id: str, before: dict[str, Any], attempt: int) -> None:
    """As a crash that lost the claim: the step row as before it, no attempt row."""
    with store.engine.begin() as conn:
        conn.execute(sa.update(step_table).where(step_table.c.id == step_id).values(**before))
        conn.execute(
            sa.delete(attempt_table).where(
                attempt_table.c.step_id == step_id, attempt_table.c.attempt == attempt
            )
        )


def step_row(store: SQLWorkflowStore, step_id: str) -> dict[str, Any]:
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(step_table).where(step_table.c.id == step_id)).one()
    return {k: v for k, v in row._asdict().items() if k != "id"}


def lost_and_claimed_again(
    store: SQLWorkflowStore,
) -> tuple[RunState, StepState, StepState, StepState]:
    """A step claimed, the claim lost, claimed again: (run, step, lost, again)."""
    run, [step] = make_tasks(store, 1, max_attempts=3)
    before = step_row(store, step.id)
    lost = claim(store, step, "a")
    lose_claim(store, step.id, before, lost.attempt)
    return run, step, lost, claim(store, step, "b")


def test_a_lost_claim_is_fenced_out_by_the_new_claim_of_the_same_attempt(
    sql_store: SQLWorkflowStore,
) -> None:
    store = sql_store
    run, step, lost, again = lost_and_claimed_again(store)
    assert again.attempt == lost.attempt == 1
    assert again.claim_id is not None and again.claim_id != lost.claim_id
    # The lost claim's body: its renewal returns False, its outcome is refused.
    assert store.refresh_step_lease(step.id, lost.attempt, LONG, lost.claim_id) is False
    with pytest.raises(WorkflowStepSupersededError) as refused:
        store.complete_step(step.id, lost.attempt, "from the lost claim", lost.claim_id)
    assert refused.value.claim_lost is True
    assert "claim id differs" in str(refused.value)
    with pytest.raises(WorkflowStepSupersededError):
        store.fail_step(step.id, lost.attempt, {"type": "X", "message": "x"}, None, lost.claim_id)
    # The new claim's renewal and outcome land.
    assert store.refresh_step_lease(step.id, again.attempt, LONG, again.claim_id) is True
    store.complete_step(step.id, again.attempt, "from the new claim", again.claim_id)
    [done] = store.get_steps(run.id)
    assert (done.status, done.result) == (StepStatus.SUCCEEDED, "from the new claim")
    [attempt] = store.get_attempts(run.id)
    assert (attempt.status, attempt.result, attempt.claim_id) == (
        AttemptStatus.SUCCEEDED,
        "from the new claim",
        again.claim_id,
    )


def test_a_lost_claim_s_outcome_is_refused_by_the_pass_too(sql_store: SQLWorkflowStore) -> None:
    store = sql_store
    run, step, lost, again = lost_and_claimed_again(store)
    stale = StepOutcome(step.id, lost.attempt, ok=True, result="late", claim_id=lost.claim_id)
    with pytest.raises(WorkflowStepSupersededError) as refused:
        take_pass(store, run.id, stale, lambda view: pytest.fail("no pass for a lost claim"))
    assert refused.value.claim_lost is True
    [still] = store.get_steps(run.id)
    assert (still.status, still.attempt, still.claim_id) == (
        StepStatus.RUNNING,
        again.attempt,
        again.claim_id,
    )


@pytest.mark.parametrize("kind", ["memory", "sql"])
def test_every_claim_has_its_own_id_and_its_attempt_row_records_it(
    kind: str, sqlite_engine: sa.Engine
) -> None:
    store: WorkflowStore = InMemoryWorkflowStore() if kind == "memory" else store_for(sqlite_engine)
    run, steps = make_tasks(store, 3)
    claims = [claim(store, s, "w") for s in steps]
    ids = {c.claim_id for c in claims}
    assert None not in ids and len(ids) == 3
    attempts = {a.step_id: a for a in store.get_attempts(run.id)}
    for c in claims:
        assert attempts[c.id].claim_id == c.claim_id
        assert attempts[c.id].dispatch == "broker"
    # A write under another claim id of the right attempt is refused and says so.
    with pytest.raises(WorkflowStepSupersededError) as refused:
        store.complete_step(claims[0].id, claims[0].attempt, "x", "0" * 32)
    assert refused.value.claim_lost is True
    assert store.refresh_step_lease(claims[0].id, claims[0].attempt, LONG, "0" * 32) is False
    # Without a claim id the attempt alone fences (callers that predate claim ids).
    store.complete_step(claims[0].id, claims[0].attempt, "ok")
