"""OpenTelemetry traces of runs (the ``otel`` extra: ``opentelemetry-api`` only).

``Pikku(app, ..., tracing=True)`` adds a :class:`TracingObserver`; any other
engine (the testing kit's) takes one with ``engine.observers.add(...)``.
Spans go to the tracer provider you configure (the SDK and an exporter are
yours to set up, as for any OpenTelemetry library); with none, every scope
is skipped: no span, no context stored or carried, next to no cost
(``benchmarks/tracing.py``).

The shape of a run's trace. A span cannot stay open across processes, and
a run lives across many, so:

- ``start()`` makes a short **run span** (``pikku.run <workflow>``: storing
  the run and its first pass). Its trace context, as a W3C carrier plus the
  workflow's name, is stored with the run (``trace_context``) and becomes
  the parent of everything the run does later. Started inside a span of
  yours (a web request), the run span is its child: the run joins your trace.
- Each claimed **attempt** is a span (``pikku.attempt <task>``) from its
  claim to its recorded outcome, a child of the run span, so a step's
  attempts and all steps are siblings however they travel (by broker or
  eagerly in the same task call). It is the current span while the body
  runs: your own spans in a task nest under it. Attributes:
  ``pikku.run_id``, ``pikku.workflow``, ``pikku.step``, ``pikku.attempt``,
  ``pikku.dispatch``, ``messaging.destination`` (and ``.name``, today's
  semantic-convention spelling), ``pikku.task``, ``pikku.worker`` and,
  once it ends, ``pikku.outcome`` (succeeded, retrying, failed, refused).
  A failed attempt has status error and the error as an ``exception`` event.
- Each **pass** a ``pikku.orchestrate`` message asked for is a span
  (``pikku.pass <workflow>``, with ``pikku.reason``), a child of the run span.
- Each **sweep** is a span of its own trace (``pikku.sweep``, with what it
  woke by reason as ``pikku.sweep.<reason>``).

The context travels on pikku's messages in their own header
(``pikku_trace``), the run's carrier; a message without one (the sweep
re-sent it, or the run was started before tracing was on) is traced under
the context stored with its run, or its parent run's, read from the store
only then. ``opentelemetry-instrumentation-celery`` keeps its own
``traceparent`` header: its producer span is a child of the span current
when pikku sends (the run, attempt or pass span), so its task spans are in
the run's trace too, beside pikku's. A child run's spans join its parent's
trace. pikku's own carrier is always W3C trace context, whatever propagator
you configure globally.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context as OtelContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status, StatusCode

from .engine.observe import AttemptWatch, Carrier, EngineObserver, RunStart, run_trace
from .engine.sweep import SweepReport
from .model.values import RunState, StepOutcome, StepState
from .version import __version__

if TYPE_CHECKING:
    from .engine.core import WorkflowEngine

RUN_ID = "pikku.run_id"
WORKFLOW = "pikku.workflow"
STEP = "pikku.step"
ATTEMPT = "pikku.attempt"
DISPATCH = "pikku.dispatch"
DESTINATION = "messaging.destination"
DESTINATION_NAME = "messaging.destination.name"
OUTCOME = "pikku.outcome"

WORKFLOW_KEY = "pikku-workflow"
"""The carrier's one key besides W3C's: the run's workflow, for its attempts' spans."""

_W3C = TraceContextTextMapPropagator()
_sweep_span: ContextVar[trace.Span | None] = ContextVar("pikku_sweep_span", default=None)


class TracingObserver(EngineObserver):
    """Spans for one engine's runs, attempts, passes and sweeps."""

    def __init__(
        self, engine: WorkflowEngine, tracer_provider: trace.TracerProvider | None = None
    ) -> None:
        self._engine = engine
        self._provider = tracer_provider
        self._tracer = trace.get_tracer("pikku_celery", __version__, tracer_provider)

    def _live(self) -> bool:
        """Whether a real tracer provider is there (the global one may be set
        later). Without one every scope is skipped: no span could be
        recorded, and no context is worth carrying or looking up."""
        provider = self._provider or trace.get_tracer_provider()
        return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))

    # --- runs ----------------------------------------------------------------
    @contextmanager
    def _starting(self, workflow: str) -> Iterator[RunStart]:
        with self._tracer.start_as_current_span(
            f"pikku.run {workflow}", attributes={WORKFLOW: workflow}
        ) as span:
            start = _Start(span, _current_carrier(workflow))
            with _run_trace(start.trace_context):
                yield start

    def starting(self, workflow: str) -> AbstractContextManager[RunStart]:
        """The run span: stored with the run, current for its first pass."""
        return self._starting(workflow) if self._live() else super().starting(workflow)

    # --- attempts ------------------------------------------------------------
    @contextmanager
    def _attempt(
        self, step: StepState, dispatch: str, claimed_ns: int, carried: Carrier | None
    ) -> Iterator[AttemptWatch]:
        known, workflow = self._context_of(step.run_id, carried)
        attributes: dict[str, str | int] = {
            RUN_ID: step.run_id,
            STEP: step.name,
            ATTEMPT: step.attempt,
            DISPATCH: dispatch,
            "pikku.task": step.task_name or "",
            "pikku.worker": step.worker or self._engine.worker_id,
        }
        if workflow:
            attributes[WORKFLOW] = workflow
        if step.queue:
            attributes[DESTINATION] = attributes[DESTINATION_NAME] = step.queue
        span = self._tracer.start_span(
            f"pikku.attempt {step.task_name or step.name}",
            context=known.context if known else None,  # None: the current context
            attributes=attributes,
            start_time=claimed_ns,
        )
        # With no run context known, the attempt's own span is what its messages carry.
        with (
            trace.use_span(span, end_on_exit=True),
            _run_trace(known.carrier if known else _current_carrier(workflow)),
        ):
            yield _Watch(span)

    def attempt(
        self, step: StepState, dispatch: str, claimed_ns: int, trace: Carrier | None
    ) -> AbstractContextManager[AttemptWatch]:
        """The attempt span, a child of its run's span, from the claim on."""
        if not self._live():
            return super().attempt(step, dispatch, claimed_ns, trace)
        return self._attempt(step, dispatch, claimed_ns, trace)

    # --- passes --------------------------------------------------------------
    @contextmanager
    def _passing(self, run: RunState, reason: str, carried: Carrier | None) -> Iterator[None]:
        known = _valid(carried) or self._stored(run)
        with self._tracer.start_as_current_span(
            f"pikku.pass {run.workflow}",
            context=known.context if known else None,
            attributes={RUN_ID: run.id, WORKFLOW: run.workflow, "pikku.reason": reason},
        ):
            own = {**known.carrier, WORKFLOW_KEY: run.workflow} if known else None
            with _run_trace(own or _current_carrier(run.workflow)):
                yield

    def passing(
        self, run: RunState, reason: str, trace: Carrier | None
    ) -> AbstractContextManager[None]:
        """The pass span, a child of its run's span."""
        if not self._live():
            return super().passing(run, reason, trace)
        return self._passing(run, reason, trace)

    # --- sweeps --------------------------------------------------------------
    @contextmanager
    def _sweeping(self) -> Iterator[None]:
        with self._tracer.start_as_current_span("pikku.sweep") as span:
            token = _sweep_span.set(span)
            try:
                with _run_trace(None):  # what it sends joins each run's stored context
                    yield
            finally:
                _sweep_span.reset(token)

    def sweeping(self) -> AbstractContextManager[None]:
        """The sweep span, a trace of its own."""
        return self._sweeping() if self._live() else super().sweeping()

    def swept(self, report: SweepReport) -> None:
        """What the sweep woke, on its span."""
        span = _sweep_span.get()
        if span is None:
            return
        for reason in (
            "requeued_lapsed",
            "expired",
            "resent",
            "due",
            "idle",
            "admitted",
            "overdue",
        ):
            span.set_attribute(f"pikku.sweep.{reason}", getattr(report, reason))
        span.set_attribute("pikku.sweep.skipped", report.skipped)

    # --- where a run's context comes from ------------------------------------
    def _context_of(self, run_id: str, carried: Carrier | None) -> tuple[_Known | None, str]:
        """The run's context and workflow: from the message, else from the store."""
        found = _valid(carried)
        if found is not None:
            return found, found.carrier.get(WORKFLOW_KEY, "")
        run = self._engine.store.get_run(run_id)
        if run is None:
            return None, ""
        return self._stored(run), run.workflow

    def _stored(self, run: RunState) -> _Known | None:
        """The context stored with the run, or with its parent (a child run has none)."""
        found = _valid(run.trace_context)
        if found is None and run.parent_run_id is not None:
            parent = self._engine.store.get_run(run.parent_run_id)
            found = _valid(parent.trace_context) if parent is not None else None
        return found


class _Start(RunStart):
    def __init__(self, span: trace.Span, carrier: Carrier | None) -> None:
        self._span = span
        self.trace_context = carrier

    def created(self, run: RunState, created: bool) -> None:
        self._span.set_attribute(RUN_ID, run.id)
        self._span.set_attribute("pikku.created", created)


class _Watch(AttemptWatch):
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def recorded(self, outcome: StepOutcome) -> None:
        if outcome.ok:
            self._span.set_attribute(OUTCOME, "succeeded")
            return
        retrying = outcome.retry_delay is not None  # a delay of 0 is a retry too
        self._span.set_attribute(OUTCOME, "retrying" if retrying else "failed")
        error = outcome.error or {}
        message = str(error.get("message", ""))
        self._span.add_event(
            "exception",
            {
                "exception.type": str(error.get("type", "")),
                "exception.message": message,
                "exception.stacktrace": str(error.get("traceback", "")),
            },
        )
        self._span.set_status(Status(StatusCode.ERROR, message))

    def refused(self) -> None:
        self._span.set_attribute(OUTCOME, "refused")


@contextmanager
def _run_trace(carrier: Carrier | None) -> Iterator[None]:
    """Messages sent meanwhile carry ``carrier``."""
    token = run_trace.set(carrier)
    try:
        yield
    finally:
        run_trace.reset(token)


def _current_carrier(workflow: str) -> Carrier | None:
    """The current span's context as a carrier; None when no span is real
    (no SDK configured): nothing worth storing."""
    carrier: Carrier = {}
    _W3C.inject(carrier)
    if "traceparent" not in carrier:
        return None
    carrier[WORKFLOW_KEY] = workflow
    return carrier


@dataclass(frozen=True)
class _Known:
    """A run's trace context, as text and as the context its spans join."""

    carrier: Carrier
    context: OtelContext


def _valid(carrier: Carrier | None) -> _Known | None:
    """``carrier``'s context if it is a valid one (a header is anyone's input)."""
    if not carrier:
        return None
    context = _W3C.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return _Known(carrier, context)
