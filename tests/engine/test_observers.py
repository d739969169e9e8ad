"""Engine observers: told each recorded attempt, refused write, settled run and sweep."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from pikku_celery import Context
from pikku_celery.engine import EngineObserver
from pikku_celery.engine.orchestrate import advance
from pikku_celery.prometheus import PrometheusObserver
from pikku_celery.store import StepOutcome
from pikku_celery.testing.inline import make_engine


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


class Broken(EngineObserver):
    def step_attempted(self, *args: Any) -> None:
        raise RuntimeError("an observer's own bug")


def test_a_run_s_attempts_refusals_and_end_are_measured() -> None:
    engine, dispatcher = make_engine()
    registry = CollectorRegistry()
    engine.observers.add(Broken())  # never breaks the engine, nor the next observer
    engine.observers.add(PrometheusObserver(registry))

    @dispatcher.task(name="obs.double")
    def double(n: int) -> int:
        return 2 * n

    @engine.workflow(name="obs.wf")
    def wf(ctx: Context, n: int) -> int:
        return int(ctx.step("a", double, n)) + int(ctx.step("b", double, n))

    run = wf.start(3)
    dispatcher.run_until_idle()
    assert run.result() == 12
    assert sample(registry, "pikku_worker_step_outcomes_total", outcome="succeeded") == 2
    assert sample(registry, "pikku_step_run_seconds_count", task="obs.double") == 2
    assert sample(registry, "pikku_run_duration_seconds_count", status="completed") == 1
    # A late outcome of an attempt no longer current is refused, and counted.
    [first, _] = run.steps()
    stale = StepOutcome(first.step.id, first.step.attempt, ok=True, result=0, claim_id="0" * 32)
    assert advance(engine, run.run_id, stale) is None
    assert sample(registry, "pikku_refused_writes_total", why="claim_lost") == 1
