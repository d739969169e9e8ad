"""Traces across Celery: pikku's context on its messages, beside Celery's instrumentation.

A 3-step run with a retry is one trace: the run span (where ``start()`` ran),
an attempt span per attempt (in whichever worker ran it) as its children,
and ``opentelemetry-instrumentation-celery``'s task spans in the same trace.
In process on Celery's test worker and under ``task_always_eager``, and on
a real prefork `celery worker` over Redis and RabbitMQ whose spans are
exported from the worker itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from celery import Celery, signals
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pikku_celery import Context, Pikku
from pikku_celery.celery.messages import TRACE_HEADER, message_trace
from pikku_celery.sql.schema import metadata
from pikku_celery.store import InMemoryWorkflowStore
from pikku_celery.testing.nodes import LocalRabbitMQContainer
from pikku_celery.tracing import TracingObserver
from tests.celery.test_real_workers import _broker
from tests.celery.workers import CeleryProcess, worker_argv
from tests.helpers import memory_broker_config, wait_until
from tests.services import SESSION_TAG

from . import tracedapp
from .support import (
    Span,
    check_run_trace,
    dispatches,
    finished,
    memory_tracing,
    named,
    read_spans,
)

STEPS = [("a", 1, "succeeded"), ("b", 1, "retrying"), ("b", 2, "succeeded"), ("c", 1, "succeeded")]


@pytest.fixture
def tracing() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """The test's tracer provider, with Celery's instrumentation on it."""
    provider, exporter = memory_tracing()
    CeleryInstrumentor().instrument(tracer_provider=provider)
    try:
        yield provider, exporter
    finally:
        CeleryInstrumentor().uninstrument()


def check_celery_spans_join(spans: list[Span], run: Span, ids: set[str] | None = None) -> None:
    """Celery's own spans (sending and running pikku's tasks) are in the run's
    trace; with ``ids``, those of these messages only (the instrumentation is
    process-wide, and other tests' apps may still be sending)."""
    sent, ran = named(spans, "apply_async/"), named(spans, "run/")
    if ids is not None:
        sent = [s for s in sent if s.attributes.get("messaging.message.id") in ids]
        ran = [s for s in ran if s.attributes.get("messaging.message.id") in ids]
    assert sent and ran
    assert {s.trace_id for s in sent + ran} == {run.trace_id}


def with_attempts(spans: list[Span], n: int) -> list[Span] | None:
    """``spans`` once ``n`` attempt spans have ended (an attempt's span ends
    just after its outcome is written, so after a waiting caller may see it)."""
    return spans if len(named(spans, "pikku.attempt")) >= n else None


def three_steps(app: Celery, pikku: Pikku) -> Any:
    @app.task(name="tc.work", bind=True, shared=False)
    def work(self: Any, name: str) -> str:
        if name == "b" and self.request.retries == 0:
            raise ConnectionError("b fails its first attempt")
        return name.upper()

    @pikku.workflow(name="tc.three")
    def three(ctx: Context) -> list[str]:
        return [ctx.step(n, work, n, retries=1, retry_delay=0) for n in ("a", "b", "c")]

    return three


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return memory_broker_config()


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"perform_ping_check": False}


def test_on_celery_s_worker_one_trace_holds_the_run_and_celery_s_spans(
    celery_app: Celery,
    request: pytest.FixtureRequest,
    tracing: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = tracing
    store = InMemoryWorkflowStore()
    pikku = Pikku(celery_app, store=store)
    pikku.observers.add(TracingObserver(pikku, provider))
    three = three_steps(celery_app, pikku)
    published: list[tuple[str, str, dict[str, str] | None]] = []

    def record(headers: dict[str, Any], **_: Any) -> None:
        published.append((headers["id"], headers.get("argsrepr", ""), headers.get(TRACE_HEADER)))

    signals.before_task_publish.connect(record, weak=False)
    try:
        request.getfixturevalue("celery_worker")
        run = three.start()
        assert run.wait(timeout=30) == ["A", "B", "C"]
    finally:
        signals.before_task_publish.disconnect(record)
    spans = wait_until(lambda: with_attempts(finished(exporter), 4), timeout=10)
    root = check_run_trace(spans, "tc.three", STEPS, dispatches(run))
    ours = [(task_id, carried) for task_id, args, carried in published if run.run_id in args]
    check_celery_spans_join(spans, root, {task_id for task_id, _ in ours})
    # Every message pikku sent carried the run's context, as stored with the run.
    stored = store.get_run(run.run_id)
    assert stored is not None and stored.trace_context is not None
    assert ours and all(carried == stored.trace_context for _, carried in ours)


def test_under_task_always_eager_the_run_is_one_trace(
    tracing: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = tracing
    app = Celery("tc_eager", set_as_current=False)
    app.conf.task_always_eager = True
    pikku = Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)
    pikku.observers.add(TracingObserver(pikku, provider))
    three = three_steps(app, pikku)
    run = three.start()
    assert run.wait(timeout=30) == ["A", "B", "C"]
    spans = finished(exporter)
    root = check_run_trace(spans, "tc.three", STEPS)
    assert {s.trace_id for s in named(spans, "run/")} == {root.trace_id}


def test_a_message_s_trace_header_is_read_and_a_malformed_one_ignored() -> None:
    app = Celery("tc_header", set_as_current=False)
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "pikku-workflow": "w"}
    seen: list[Any] = []

    @app.task(name="tc.read", bind=True, shared=False)
    def read(self: Any) -> None:
        seen.append(message_trace(self.request))

    for header in (carrier, "text", {"k": 1}, {str(i): "v" for i in range(50)}, {"k": "v" * 5000}):
        read.apply(headers={TRACE_HEADER: header})
    read.apply()
    assert seen == [carrier, None, None, None, None, None]


# --- a real prefork worker, exporting its own spans ---------------------------------


@pytest.fixture(scope="module")
def pg_tables(postgres_url: str) -> str:
    engine = sa.create_engine(postgres_url)
    metadata.create_all(engine)
    engine.dispose()
    return postgres_url


class TracedWorker(CeleryProcess):
    app_module = "tests.tracing.tracedapp"


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_on_a_real_worker_one_trace_spans_both_processes(
    broker: str,
    pg_tables: str,
    tmp_path: Path,
    tracing: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = tracing
    node = _broker(broker)
    traces = tmp_path / "worker-spans.jsonl"
    env = {
        "PIKKU_T_BROKER": node.url,
        "PIKKU_T_DATABASE": pg_tables,
        "PIKKU_T_QUEUE": f"{SESSION_TAG}-traced-{broker}",
        "PIKKU_T_TRACES": str(traces),
    }
    built = tracedapp.build(env, provider)
    engine = built.pikku.sql_engine
    assert engine is not None
    run = built.three.start()  # no worker yet: its first message waits in the broker
    # Only the messages can tell the worker the run's context now: the
    # stored one is gone.
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE pikku_workflow_run SET trace_context = NULL WHERE id = :id"),
            {"id": run.run_id},
        )
    name = f"traced-{broker}-{SESSION_TAG}"
    argv = worker_argv([built.queue], name)
    proc = TracedWorker(argv, env, tmp_path / f"{name}.log").start()
    try:
        proc.wait_ready(timeout=60)
        assert run.wait(timeout=60) == ["A", "B", "C"]
        worker_spans = wait_until(
            lambda: with_attempts(read_spans(traces), 4), timeout=20, interval=0.1
        )
    except Exception:
        print(proc.log()[-4000:])
        raise
    finally:
        proc.kill()
        if isinstance(node, LocalRabbitMQContainer):
            node.delete_queues([built.queue])
        else:
            redis.Redis.from_url(node.url).delete(built.queue)
        node.teardown()
        engine.dispose()
    spans = finished(exporter) + worker_spans
    root = check_run_trace(spans, "traced.three", STEPS, dispatches(run))
    check_celery_spans_join(spans, root)
    attempts = named(worker_spans, "pikku.attempt")
    assert built.pikku.worker_id not in {a.attributes["pikku.worker"] for a in attempts}
    assert {a.attributes["messaging.destination"] for a in attempts} == {built.queue}
