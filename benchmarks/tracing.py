"""What tracing costs per step: the same runs untraced and traced, same process, same run.

    python benchmarks/tracing.py [--steps 10] [--runs 200] [--rounds 5]

An engine on the in-memory store and the inline dispatcher (no broker, no
database: the engine's own work, where a tracer's share is largest) runs
N-step workflows three ways, interleaved round by round: no observer;
``TracingObserver`` on the API's no-op provider (``tracing=True`` with no
SDK configured); and on the SDK with a processor that drops each finished
span (the SDK's cost without an exporter's). Prints the median time per
step of each and its ratio to the untraced runs of the same round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from pikku_celery import Context
from pikku_celery.engine import WorkflowEngine
from pikku_celery.testing import InlineDispatcher, make_engine
from pikku_celery.tracing import TracingObserver


class Dropped(SpanExporter):
    """Drops every span: the SDK's work without an exporter's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def engine_with(
    steps: int, provider: trace.TracerProvider | None
) -> tuple[WorkflowEngine, InlineDispatcher, Callable[[], object]]:
    engine, dispatcher = make_engine()
    if provider is not None:
        engine.observers.add(TracingObserver(engine, provider))

    @dispatcher.task(name="bench.inc")
    def inc(n: int) -> int:
        return n + 1

    @engine.workflow(name="bench.steps")
    def chain(ctx: Context) -> int:
        n = 0
        for i in range(steps):
            n = int(ctx.step(f"s{i}", inc, n))
        return n

    return engine, dispatcher, lambda: chain.start()


def per_step(steps: int, runs: int, provider: trace.TracerProvider | None) -> float:
    """Seconds per step over ``runs`` runs, started and driven to the end."""
    _, dispatcher, start = engine_with(steps, provider)
    began = time.perf_counter()
    for _ in range(runs):
        start()
        dispatcher.run_until_idle()
    return (time.perf_counter() - began) / (runs * steps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(Dropped()))
    kinds: dict[str, trace.TracerProvider | None] = {
        "untraced": None,
        "traced, no SDK (no-op)": trace.NoOpTracerProvider(),
        "traced, SDK (spans dropped)": sdk,
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    ratios: dict[str, list[float]] = {k: [] for k in kinds}
    per_step(args.steps, 20, sdk)  # warm up imports and caches
    for _ in range(args.rounds):
        base = per_step(args.steps, args.runs, None)
        for kind, provider in kinds.items():
            t = base if provider is None else per_step(args.steps, args.runs, provider)
            times[kind].append(t)
            ratios[kind].append(t / base)
    print(f"{args.steps}-step runs x {args.runs}, {args.rounds} rounds (medians)")
    print(f"{'':30} {'us/step':>10} {'vs untraced':>12}")
    for kind in kinds:
        us = statistics.median(times[kind]) * 1e6
        print(f"{kind:30} {us:10.1f} {statistics.median(ratios[kind]):11.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
