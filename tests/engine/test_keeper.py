"""The per-process lease keeper: finished steps do not pile up."""

from __future__ import annotations

from pikku_celery.engine.keeper import StepLeaseKeeper
from pikku_celery.store import InMemoryWorkflowStore


def test_finished_steps_are_forgotten_even_with_long_leases() -> None:
    keeper = StepLeaseKeeper(InMemoryWorkflowStore())
    live = keeper.hold("live", 1, 3_600_000)
    for i in range(10_000):  # an hour-long lease: nothing comes due in this test
        keeper.drop(keeper.hold(f"s{i}", 1, 3_600_000))
    kept = keeper.kept()
    assert len(kept) < 200
    assert any(holding is live for holding in kept)
    keeper.drop(live)
