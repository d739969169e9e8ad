"""Traces of runs in process: a run span, attempt spans beside each other, sweeps.

On every store (memory, SQLite, PostgreSQL): the run's trace context is
stored with the run, and a step the sweep re-sends (its message carries no
context) is still traced in the run's trace.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from pikku_celery import Context
from pikku_celery.errors import WorkflowStepSupersededError
from pikku_celery.model.plan import Moved, PassView, PassWrite
from pikku_celery.model.values import AdvanceResult
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from pikku_celery.testing import make_engine
from pikku_celery.tracing import TracingObserver
from tests.tracing.support import check_run_trace, finished, memory_tracing, named


def test_a_three_step_run_with_a_retry_is_one_trace(store: WorkflowStore) -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(store)
    engine.observers.add(TracingObserver(engine, provider))
    failures = {"b": 1}

    @dispatcher.task(name="tr.work", queue="fast")
    def work(name: str) -> str:
        if failures.get(name, 0) > 0:
            failures[name] -= 1
            raise ConnectionError(f"{name} failed once")
        return name.upper()

    @engine.workflow(name="tr.three")
    def three(ctx: Context) -> list[str]:
        return [ctx.step(n, work, n, retries=1, retry_delay=0) for n in ("a", "b", "c")]

    run = three.start()
    dispatcher.run_until_idle()
    assert run.result() == ["A", "B", "C"]

    spans = finished(exporter)
    assert {s.trace_id for s in spans} == {named(spans, "pikku.run")[0].trace_id}
    steps = [
        ("a", 1, "succeeded"),
        ("b", 1, "retrying"),
        ("b", 2, "succeeded"),
        ("c", 1, "succeeded"),
    ]
    root = check_run_trace(spans, "tr.three", steps)
    assert root.parent_id is None and root.attributes["pikku.run_id"] == run.run_id
    [first, failed, retried, _] = named(spans, "pikku.attempt")
    assert first.name == "pikku.attempt tr.work"
    assert first.attributes["messaging.destination"] == "fast"
    assert failed.status == "ERROR" and retried.status == "UNSET"
    # The stored context is the run span's: what later passes and re-sent steps join.
    stored = store.get_run(run.run_id)
    assert stored is not None and stored.trace_context is not None
    assert root.span_id in stored.trace_context["traceparent"]


def test_a_run_started_in_a_caller_s_span_joins_its_trace(store: WorkflowStore) -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(store)
    engine.observers.add(TracingObserver(engine, provider))

    @dispatcher.task(name="tr.one")
    def one() -> int:
        return 1

    @engine.workflow(name="tr.single")
    def single(ctx: Context) -> int:
        return int(ctx.step("one", one))

    with provider.get_tracer("web").start_as_current_span("POST /orders") as request:
        run = single.start()
    dispatcher.run_until_idle()
    assert run.result() == 1
    spans = finished(exporter)
    [caller] = named(spans, "POST /orders")
    root = check_run_trace(spans, "tr.single", [("one", 1, "succeeded")])
    assert root.parent_id == caller.span_id
    assert root.trace_id == f"{request.get_span_context().trace_id:032x}"


def test_a_step_the_sweep_resends_joins_the_run_s_trace_and_the_sweep_has_its_own(
    store: WorkflowStore,
) -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(store, message_grace=0.0)
    engine.observers.add(TracingObserver(engine, provider))
    dispatcher.drop = lambda msg: msg.kind == "step" and len(dispatcher.sent) == 1  # lost

    @dispatcher.task(name="tr.lost")
    def lost() -> str:
        return "found"

    @engine.workflow(name="tr.resent")
    def resent(ctx: Context) -> str:
        return str(ctx.step("lost", lost))

    run = resent.start()
    dispatcher.run_until_idle()
    assert engine.sweep().resent == 1
    assert dispatcher.sent[-1].trace is None  # the sweep's message carries no context
    dispatcher.run_until_idle()
    assert run.result() == "found"

    spans = finished(exporter)
    root = check_run_trace(spans, "tr.resent", [("lost", 1, "succeeded")])
    [sweep] = named(spans, "pikku.sweep")
    assert sweep.trace_id != root.trace_id and sweep.parent_id is None
    assert sweep.attributes["pikku.sweep.resent"] == 1
    assert sweep.attributes["pikku.sweep.skipped"] is False


def test_a_pass_a_message_asks_for_is_a_span_of_the_run(store: WorkflowStore) -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(store)
    engine.observers.add(TracingObserver(engine, provider))

    @engine.workflow(name="tr.waits")
    def waits(ctx: Context) -> object:
        return ctx.wait_for_signal("go", timeout=60)

    run = waits.start()
    engine.send_signal(run.run_id, "go", {"ok": True})
    dispatcher.run_until_idle()
    assert run.result() == {"ok": True}
    spans = finished(exporter)
    [root] = named(spans, "pikku.run tr.waits")
    [signalled] = named(spans, "pikku.pass tr.waits")
    assert signalled.parent_id == root.span_id and signalled.trace_id == root.trace_id
    assert signalled.attributes["pikku.reason"] == "signal"


def test_without_an_sdk_no_span_is_made_and_no_context_stored(store: WorkflowStore) -> None:
    engine, dispatcher = make_engine(store)
    engine.observers.add(TracingObserver(engine, trace.NoOpTracerProvider()))

    @dispatcher.task(name="tr.plain")
    def plain() -> int:
        return 2

    @engine.workflow(name="tr.untraced")
    def untraced(ctx: Context) -> int:
        return int(ctx.step("plain", plain))

    run = untraced.start()
    dispatcher.run_until_idle()
    assert run.result() == 2
    stored = store.get_run(run.run_id)
    assert stored is not None and stored.trace_context is None
    assert all(msg.trace is None for msg in dispatcher.sent)


class TakenOverStore(InMemoryWorkflowStore):
    """A store on which every attempt's outcome comes too late: another
    claim has taken the step over meanwhile, so the fenced write is refused."""

    def write_pass(self, read: PassView, plan: PassWrite) -> AdvanceResult | Moved:
        if plan.outcome is not None:
            done = plan.outcome.outcome
            raise WorkflowStepSupersededError(done.step_id, done.attempt)
        return super().write_pass(read, plan)


def test_an_attempt_whose_write_is_refused_says_so() -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(TakenOverStore())
    engine.observers.add(TracingObserver(engine, provider))

    @dispatcher.task(name="tr.late")
    def late() -> str:
        return "too late"

    @engine.workflow(name="tr.refused")
    def refused(ctx: Context) -> str:
        return str(ctx.step("late", late))

    refused.start()
    dispatcher.run_until_idle()
    [attempt] = named(finished(exporter), "pikku.attempt")
    assert attempt.attributes["pikku.outcome"] == "refused"
    assert attempt.attributes["pikku.step"] == "late"


def test_a_child_run_s_spans_join_its_parent_s_trace_even_re_sent(store: WorkflowStore) -> None:
    provider, exporter = memory_tracing()
    engine, dispatcher = make_engine(store, message_grace=0.0)
    engine.observers.add(TracingObserver(engine, provider))

    @dispatcher.task(name="tr.leaf")
    def leaf(n: int) -> int:
        return n * 10

    @engine.workflow(name="tr.child")
    def child(ctx: Context, n: int) -> int:
        return int(ctx.step("leaf", leaf, n))

    @engine.workflow(name="tr.parent")
    def parent(ctx: Context) -> int:
        return int(ctx.child("kid", child, 4)) + 1

    dropped: list[object] = []

    def lose_the_leaf(msg: Any) -> bool:  # the sweep re-sends it, with no context
        if msg.task_name == "tr.leaf" and not dropped:
            dropped.append(msg)
            return True
        return False

    dispatcher.drop = lose_the_leaf
    run = parent.start()
    dispatcher.run_until_idle()
    assert dropped and engine.sweep().resent == 1
    dispatcher.run_until_idle()
    assert run.result() == 41
    spans = finished(exporter)
    [root] = named(spans, "pikku.run tr.parent")
    [sweep] = named(spans, "pikku.sweep")  # a trace of its own
    assert {s.trace_id for s in spans if s != sweep} == {root.trace_id}
    [attempt] = named(spans, "pikku.attempt")
    assert attempt.attributes["pikku.workflow"] == "tr.child"
    assert attempt.parent_id == root.span_id
    child_passes = [
        s for s in named(spans, "pikku.pass") if s.attributes["pikku.workflow"] == "tr.child"
    ]
    assert child_passes and all(p.parent_id == root.span_id for p in child_passes)
