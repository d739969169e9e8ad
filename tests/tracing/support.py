"""Spans as the tests read them: one record per finished span, from any process."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


@dataclass(frozen=True)
class Span:
    """A finished span: its name, ids (hex), parent and attributes."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    status: str
    start: int
    end: int

    @classmethod
    def of(cls, span: ReadableSpan) -> Span:
        context = span.get_span_context()
        assert context is not None
        return cls(
            name=span.name,
            trace_id=f"{context.trace_id:032x}",
            span_id=f"{context.span_id:016x}",
            parent_id=f"{span.parent.span_id:016x}" if span.parent else None,
            attributes=dict(span.attributes or {}),
            status=span.status.status_code.name,
            start=span.start_time or 0,
            end=span.end_time or 0,
        )


def memory_tracing() -> tuple[TracerProvider, InMemorySpanExporter]:
    """A tracer provider of the test's own (never the global one) and its exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def finished(exporter: InMemorySpanExporter) -> list[Span]:
    return [Span.of(s) for s in exporter.get_finished_spans()]


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line (a worker's
    spans, read by the test process)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(Span.of(span).__dict__) + "\n")
        return SpanExportResult.SUCCESS


def read_spans(path: Path) -> list[Span]:
    if not path.exists():
        return []
    return [Span(**json.loads(line)) for line in path.read_text().splitlines() if line]


def named(spans: Iterable[Span], prefix: str) -> list[Span]:
    return sorted((s for s in spans if s.name.startswith(prefix)), key=lambda s: s.start)


def dispatches(run: Any) -> list[str | None]:
    """How each attempt of the run reached its worker, step by step (a
    sequential run's attempts come in that order)."""
    return [a.dispatch for h in run.steps() for a in h.attempts]


def check_run_trace(
    spans: list[Span],
    workflow: str,
    steps: list[tuple[str, int, str]],
    dispatched: list[str | None] | None = None,
) -> Span:
    """The shape every traced run has: one run span, and one span per attempt
    (in ``steps``' order: step name, attempt, outcome), each a child of the
    run span, in its trace, with its attributes; ``dispatched`` says how each
    attempt came (default: all through the broker). Returns the run span."""
    [run] = named(spans, f"pikku.run {workflow}")
    attempts = named(spans, "pikku.attempt")
    assert [
        (a.attributes["pikku.step"], a.attributes["pikku.attempt"], a.attributes["pikku.outcome"])
        for a in attempts
    ] == steps
    expected = dispatched if dispatched is not None else ["broker"] * len(attempts)
    seen = [a.attributes["pikku.dispatch"] for a in attempts]
    assert seen == expected, (seen, expected)
    for attempt in attempts:
        assert attempt.trace_id == run.trace_id
        assert attempt.parent_id == run.span_id  # siblings, never nested
        assert attempt.attributes["pikku.run_id"] == run.attributes["pikku.run_id"]
        assert attempt.attributes["pikku.workflow"] == workflow
        assert attempt.start <= attempt.end
    return run
