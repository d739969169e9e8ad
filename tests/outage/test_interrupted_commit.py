"""A start whose commit landed although its connection broke on the way.

The outage cut the line after the database stored the run and before the
caller heard so. The retry finds the run stored: the same run comes back,
one run, with its first pass taken; never a second run, never a refusal.
"""

from __future__ import annotations

from typing import Any

import pytest

from pikku_celery import StoreUnavailableError
from pikku_celery.engine import Context
from pikku_celery.store import InMemoryWorkflowStore, NewRun, RunState
from pikku_celery.testing import make_engine


class CutAfterCommit(InMemoryWorkflowStore):
    """Stores a new run, then loses the line once before answering."""

    cuts = 1

    def create_run(self, new: NewRun) -> tuple[RunState, bool]:
        made = super().create_run(new)
        if self.cuts:
            self.cuts -= 1
            raise StoreUnavailableError("the line was cut while the commit was answered")
        return made


@pytest.mark.parametrize("key", [None, "order-7"])
def test_the_interrupted_start_returns_its_one_run(key: str | None) -> None:
    store = CutAfterCommit()
    engine, dispatcher = make_engine(store, outage_timeout=5.0)

    @dispatcher.task
    def charge(cents: int) -> str:
        return f"charged {cents}"

    @engine.workflow
    def order(ctx: Context, cents: int) -> Any:
        return ctx.step("charge", charge, cents)

    run = order.start(1999, idempotency_key=key)
    assert store.cuts == 0  # the cut happened, after the run was stored
    assert [r.id for r in store.list_runs()] == [run.run_id]
    assert [s.name for s in store.get_steps(run.run_id)] == ["charge"]  # its first pass
    dispatcher.run_until_idle()
    assert run.result() == "charged 1999"
