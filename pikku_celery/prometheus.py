"""Worker-side metrics with ``prometheus_client``: what only a worker process sees.

The store holds every attempt's outcome (``/metrics`` of the run page counts
those); a worker alone knows how long a body ran, how long its step waited
for a worker, which late writes it refused and what a sweep woke. Add
``PrometheusObserver`` to an engine (``Pikku(..., metrics=True)`` does) and
scrape its registry. Under a prefork pool set ``PROMETHEUS_MULTIPROC_DIR``
for the worker (before it starts, an empty directory): each child process
then writes its samples there, and the run page's ``/metrics`` adds them up
(``prometheus_client``'s multiprocess mode), so no child's counts are lost
when the pool recycles it.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from .engine.observe import EngineObserver
from .engine.sweep import SweepReport
from .model.values import RunState, StepOutcome, StepState

SWEEP_REASONS = ("requeued_lapsed", "expired", "resent", "due", "idle", "admitted", "overdue")
"""The sweep's wake-ups, as :class:`~pikku_celery.engine.sweep.SweepReport` counts them."""


class PrometheusObserver(EngineObserver):
    """Counters and histograms of one process, on ``registry`` (default: the global one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        on = REGISTRY if registry is None else registry
        self.outcomes = Counter(
            "pikku_worker_step_outcomes",
            "Attempts whose outcome this process recorded, by outcome.",
            ["outcome"],
            registry=on,
        )
        self.run_seconds = Histogram(
            "pikku_step_run_seconds", "How long step bodies ran.", ["task"], registry=on
        )
        self.queue_wait = Histogram(
            "pikku_step_queue_wait_seconds",
            "From a step's message being sent to its claim, on the store's clock.",
            ["queue"],
            registry=on,
        )
        self.refused = Counter(
            "pikku_refused_writes",
            "Outcomes refused: a superseded attempt's, or a lost claim's.",
            ["why"],
            registry=on,
        )
        self.run_duration = Histogram(
            "pikku_run_duration_seconds",
            "From a run's start to its end, for runs a pass of this process ended.",
            ["status"],
            registry=on,
        )
        self.sweep_wakeups = Counter(
            "pikku_sweep_wakeups", "What sweeps woke, by reason.", ["reason"], registry=on
        )

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        """Count the outcome; observe the body's run time and the step's wait."""
        retrying = outcome.retry_delay is not None  # a delay of 0 is a retry too
        kind = "succeeded" if outcome.ok else "retrying" if retrying else "failed"
        self.outcomes.labels(kind).inc()
        self.run_seconds.labels(step.task_name or "").observe(run_seconds)
        if step.scheduled_at is not None and step.updated_at >= step.scheduled_at:
            waited = (step.updated_at - step.scheduled_at) / 1000
            self.queue_wait.labels(step.queue or "").observe(waited)

    def write_refused(self, step_id: str, attempt: int, claim_lost: bool) -> None:
        """Count a refused write by why it was refused."""
        self.refused.labels("claim_lost" if claim_lost else "superseded").inc()

    def run_settled(self, run: RunState) -> None:
        """Observe the run's duration by how it ended."""
        seconds = max(0, run.updated_at - run.created_at) / 1000
        self.run_duration.labels(run.status.value).observe(seconds)

    def swept(self, report: SweepReport) -> None:
        """Count each reason's wake-ups."""
        for reason in SWEEP_REASONS:
            n = getattr(report, reason)
            if n:
                self.sweep_wakeups.labels(reason).inc(n)
