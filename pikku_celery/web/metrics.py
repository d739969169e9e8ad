"""Prometheus metrics read from the store at each scrape.

Every worker process writes its steps' outcomes and attempts to the store, so
counting there counts every process of every prefork pool, with no shared
state between workers (``prometheus_client``'s multiprocess mode) and nothing
lost when a worker dies. Attempt rows are append-only, so their counts only
grow and are exposed as counters; runs and steps by status are gauges. Each
scrape is a handful of ``GROUP BY`` queries.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..ports.store import WorkflowStore


class StoreCollector(Collector):
    """Runs, steps and attempts by status, and the steps waiting for a worker."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        """The metrics as the store has them now."""
        store = self.store
        runs = GaugeMetricFamily("pikku_runs", "Workflow runs by status.", labels=["status"])
        for status, n in store.count_runs_by_status().items():
            runs.add_metric([status.value], n)
        yield runs
        steps = GaugeMetricFamily("pikku_steps", "Steps by status.", labels=["status"])
        for step_status, n in store.count_steps_by_status().items():
            steps.add_metric([step_status.value], n)
        yield steps
        attempts = CounterMetricFamily(
            "pikku_step_attempts",
            "Step attempts by how they ended (superseded: its lease lapsed and another "
            "attempt took the step over; its late write, if any, was refused).",
            labels=["status"],
        )
        for attempt_status, n in store.count_attempts_by_status().items():
            attempts.add_metric([attempt_status.value], n)
        yield attempts
        waiting = GaugeMetricFamily(
            "pikku_unclaimed_steps",
            "Task steps sent (or due) and not yet claimed by a worker, by queue.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "pikku_oldest_unclaimed_step_seconds",
            "How long the oldest unclaimed task step of each queue has waited.",
            labels=["queue"],
        )
        for queue, count, oldest_ms in store.waiting_by_queue(0):
            label = queue or ""
            waiting.add_metric([label], count)
            oldest.add_metric([label], oldest_ms / 1000)
        yield waiting
        yield oldest


def render_metrics(store: WorkflowStore) -> tuple[bytes, str]:
    """The store's metrics in Prometheus' text format, and its content type;
    with ``PROMETHEUS_MULTIPROC_DIR`` set, the worker processes' samples
    written there too (:mod:`pikku_celery.prometheus`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry), CONTENT_TYPE_LATEST
