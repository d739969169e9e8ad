"""A traced Celery app: what real `celery worker` subprocesses load in the tracing tests.

The worker traces as a user's would: ``Pikku(tracing=True)`` on the global
tracer provider, set up with ``opentelemetry-instrumentation-celery`` in
each pool process (``worker_process_init``), its finished spans appended
to the file ``PIKKU_T_TRACES`` names. The test process builds the same app
with a tracer provider of its own. Settings: ``PIKKU_T_BROKER``,
``PIKKU_T_DATABASE``, ``PIKKU_T_QUEUE`` (the queue), ``PIKKU_T_TRACES``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery, signals
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from pikku_celery import Context, Pikku, Workflow
from pikku_celery.tracing import TracingObserver

from .support import JsonLinesExporter


@dataclass
class TracedApp:
    app: Celery
    pikku: Pikku
    queue: str
    three: Workflow[None, list[str]]


def build(env: Mapping[str, str], tracer_provider: TracerProvider | None = None) -> TracedApp:
    """The app; traced on ``tracer_provider``, or (None) on the global provider."""
    queue = env.get("PIKKU_T_QUEUE", "pikku-traced")
    app = Celery("pikku_traced", broker=env["PIKKU_T_BROKER"], set_as_current=False)
    app.conf.update(
        broker_transport_options={"polling_interval": 0.05},
        task_default_queue=queue,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    pikku = Pikku(app, env["PIKKU_T_DATABASE"], tracing=tracer_provider is None)
    if tracer_provider is not None:
        pikku.observers.add(TracingObserver(pikku, tracer_provider))

    @app.task(name="traced.work", bind=True, shared=False)
    def work(self: Any, name: str) -> str:
        if name == "b" and self.request.retries == 0:
            raise ConnectionError("b fails its first attempt")
        return name.upper()

    @pikku.workflow(name="traced.three")
    def three(ctx: Context) -> list[str]:
        return [ctx.step(n, work, n, retries=1, retry_delay=0) for n in ("a", "b", "c")]

    return TracedApp(app, pikku, queue, three)


def _trace_to_file(**_: Any) -> None:
    """In each pool process: spans to the file, Celery's instrumentation on."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(_traces))))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument()


if os.environ.get("PIKKU_T_TRACES"):
    _traces = os.environ["PIKKU_T_TRACES"]
    signals.worker_process_init.connect(_trace_to_file, weak=False)
    app = build(os.environ).app
