"""The engine names a step's run at every store call that addresses the step.

A store distributed by run routes a call that names the run to one shard; one
that does not costs it a read of the step's run across every shard first. The
engine always knows the run (its messages carry it), so none of its calls may
leave it out: a store that records the calls without a run proves it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.engine.execute import call_with
from pikku_celery.errors import WorkflowFailedError
from pikku_celery.model.values import JSON, Delivery, ErrorInfo
from pikku_celery.store import AttemptStatus, InMemoryWorkflowStore, StepState
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.helpers import wait_until

from .conftest import Harness, kill_renewals

LEASE_MS = 300


class RunNamedOnly(InMemoryWorkflowStore):
    """The memory store, noting each call that addresses a step without its run."""

    def __init__(self) -> None:
        super().__init__()
        self.unnamed: list[str] = []

    def _note(self, call: str, run_id: str | None) -> None:
        if run_id is None:
            self.unnamed.append(call)

    def get_step(self, step_id: str, *, run_id: str | None = None) -> StepState | None:
        self._note("get_step", run_id)
        return super().get_step(step_id, run_id=run_id)

    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        self._note("claim_step", run_id)
        return super().claim_step(
            step_id,
            task_name,
            worker,
            lease_ms,
            run_id=run_id,
            bound_ms=bound_ms,
            delivery=delivery,
        )

    def refresh_step_lease(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int | None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> bool:
        self._note("refresh_step_lease", run_id)
        return super().refresh_step_lease(step_id, attempt, lease_ms, claim_id, run_id=run_id)

    def complete_step(
        self,
        step_id: str,
        attempt: int,
        result: JSON,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        self._note("complete_step", run_id)
        super().complete_step(step_id, attempt, result, claim_id, run_id=run_id)

    def fail_step(
        self,
        step_id: str,
        attempt: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> None:
        self._note("fail_step", run_id)
        super().fail_step(step_id, attempt, error, retry_delay, claim_id, run_id=run_id)

    def expire_step(
        self, step_id: str, bound_ms: int | None = None, *, run_id: str | None = None
    ) -> bool:
        self._note("expire_step", run_id)
        return super().expire_step(step_id, bound_ms, run_id=run_id)


@pytest.fixture
def store() -> RunNamedOnly:
    return RunNamedOnly()


@pytest.fixture
def h(store: RunNamedOnly) -> Harness:
    engine, dispatcher = make_engine(
        store,
        InlineDispatcher(lease_ms=LEASE_MS),
        sweep_backoff=0.0,
        idle_after=0.0,
        message_grace=0.0,
    )
    return Harness(engine, dispatcher)


def test_claims_renewals_and_outcomes_name_the_run(store: RunNamedOnly, h: Harness) -> None:
    @h.task
    def slow() -> str:
        # long enough for the keeper to renew the lease (at half of it)
        wait_until(lambda: any(a.renewals for a in store.get_attempts(run.run_id)), timeout=5)
        return "slow"

    @h.task
    def flaky() -> str:
        if h.count("flaky") == 1:
            raise ValueError("once")
        return "flaky"

    @h.workflow
    def wf(ctx: Context) -> Any:
        return [ctx.step("slow", slow), ctx.step("flaky", flaky, retries=1, retry_delay=0.0)]

    run = wf.start()
    h.run()
    assert run.wait(timeout=5) == ["slow", "flaky"]
    assert store.unnamed == []


def test_the_sweep_expires_a_dead_step_naming_its_run(
    store: RunNamedOnly, h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    never = threading.Event()

    @h.task
    def hang() -> None:
        h.count("hang")
        never.wait(30)

    @h.workflow
    def wf(ctx: Context) -> Any:
        return ctx.step("hang", hang)

    kill_renewals(h, monkeypatch)
    run = wf.start()
    (msg,) = h.dispatcher.messages
    h.dispatcher.messages.clear()
    worker = threading.Thread(target=h.dispatcher.deliver, args=(msg,), daemon=True)
    worker.start()
    try:
        wait_until(lambda: h.calls.get("hang") == 1)
        wait_until(lambda: store.lapsed_steps(10) != [], timeout=5)
        assert h.engine.sweep().expired == 1
        h.run()
        with pytest.raises(WorkflowFailedError):
            run.wait(timeout=5)
    finally:
        never.set()
        worker.join(10)
    [row] = store.get_attempts(run.run_id)
    assert row.status == AttemptStatus.LEASE_EXPIRED
    assert store.unnamed == []


def test_a_message_naming_another_run_touches_nothing(store: RunNamedOnly, h: Harness) -> None:
    @h.task
    def add(x: int) -> int:
        h.count("add")
        return x + 1

    @h.workflow
    def wf(ctx: Context, x: int) -> Any:
        return ctx.step("add", add, x)

    mine, other = wf.start(1), wf.start(2)
    [step] = store.get_steps(mine.run_id)
    before = store.get_steps(mine.run_id), store.get_attempts(mine.run_id)
    assert h.engine.execute_step(other.run_id, step.id, step.task_name, call_with(add)) is None
    assert h.calls == {}
    assert (store.get_steps(mine.run_id), store.get_attempts(mine.run_id)) == before
    h.run()
    assert (mine.wait(timeout=5), other.wait(timeout=5)) == (2, 3)
    assert store.unnamed == []
