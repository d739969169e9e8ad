"""Engine fixtures: the same tests on the memory, SQLite and PostgreSQL stores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.engine import WorkflowEngine
from pikku_celery.engine.keeper import StepHolding
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from pikku_celery.testing import InlineDispatcher, make_engine

STORES = ["memory", "sqlite", "postgres"]


def _sql_store(engine: sa.Engine) -> WorkflowStore:
    from pikku_celery.sql.schema import metadata
    from pikku_celery.store.sql_for import store_for

    metadata.create_all(engine)
    return store_for(engine)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[WorkflowStore]:
    kind = request.param
    if kind == "memory":
        yield InMemoryWorkflowStore()
    else:
        store = _sql_store(request.getfixturevalue(f"{kind}_engine"))
        yield store
        store.close()  # its settle listener's LISTEN connection, if wait() started one


class Harness:
    """An engine, its inline dispatcher, and a place for tasks to count calls."""

    def __init__(self, engine: WorkflowEngine, dispatcher: InlineDispatcher) -> None:
        self.engine = engine
        self.dispatcher = dispatcher
        self.task = dispatcher.task
        self.workflow = engine.workflow
        self.calls: dict[str, int] = {}

    def count(self, name: str) -> int:
        self.calls[name] = self.calls.get(name, 0) + 1
        return self.calls[name]

    def run(self, timeout: float = 15.0) -> int:
        return self.dispatcher.run_until_idle(timeout=timeout)


@pytest.fixture
def h(store: WorkflowStore) -> Harness:
    engine, dispatcher = make_engine(store)
    return Harness(engine, dispatcher)


def make_harness(store: WorkflowStore, **options: Any) -> Harness:
    engine, dispatcher = make_engine(store, **options)
    return Harness(engine, dispatcher)


def kill_renewals(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempts get no lease renewal: as if the renewing thread were killed."""
    monkeypatch.setattr(
        h.engine.keeper,
        "hold",
        lambda step_id, attempt, lease_ms, claim_id=None, run_id=None: StepHolding(
            step_id, attempt, lease_ms, claim_id, run_id=run_id
        ),
    )


def lease_lapsed(h: Harness, step_id: str) -> bool:
    step = h.engine.store.get_step(step_id)
    now = h.engine.store.now_ms()
    return bool(step and step.lease_expires_at is not None and step.lease_expires_at <= now)
