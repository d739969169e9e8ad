"""Engine observers: told each recorded attempt, refused write, settled run and sweep."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from prometheus_client import CollectorRegistry

from pikku_celery import Context, StepFailedError
from pikku_celery.engine import AttemptWatch, EngineObserver, RunStart
from pikku_celery.engine.orchestrate import advance
from pikku_celery.prometheus import PrometheusObserver
from pikku_celery.store import StepOutcome, StepState
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


class BrokenScopes(EngineObserver):
    """Every scope fails: to open (attempts, sweeps) or to close (starts, passes)."""

    def attempt(self, *args: Any) -> Any:
        raise RuntimeError("cannot open")

    def sweeping(self) -> Any:
        raise RuntimeError("cannot open")

    @contextmanager
    def starting(self, workflow: str) -> Iterator[RunStart]:
        yield RunStart()
        raise RuntimeError("cannot close")

    @contextmanager
    def passing(self, *args: Any) -> Iterator[None]:
        yield
        raise RuntimeError("cannot close")


class Scopes(EngineObserver):
    """Records each scope it is given and how it ended."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @contextmanager
    def attempt(self, step: StepState, *args: Any) -> Iterator[AttemptWatch]:
        watch = Watch(self.seen, step.name)
        yield watch
        self.seen.append(f"closed {step.name}")

    @contextmanager
    def sweeping(self) -> Iterator[None]:
        yield
        self.seen.append("swept")


class Watch(AttemptWatch):
    def __init__(self, seen: list[str], name: str) -> None:
        self.seen, self.name = seen, name

    def recorded(self, outcome: StepOutcome) -> None:
        self.seen.append(f"recorded {self.name} ok={outcome.ok}")


def test_an_observer_s_broken_scope_never_breaks_the_engine_nor_the_others() -> None:
    engine, dispatcher = make_engine()
    scopes = Scopes()
    engine.observers.add(BrokenScopes())
    engine.observers.add(scopes)

    @dispatcher.task(name="obs.fails")
    def fails() -> None:
        raise ValueError("no")

    @engine.workflow(name="obs.scoped")
    def scoped(ctx: Context) -> object:
        with suppress(StepFailedError):
            ctx.step("x", fails)
        return ctx.wait_for_signal("go")

    run = scoped.start()
    dispatcher.run_until_idle()
    engine.send_signal(run.run_id, "go", 1)
    dispatcher.run_until_idle()
    engine.sweep()
    assert run.result() == 1
    assert scopes.seen == ["recorded x ok=False", "closed x", "swept"]
