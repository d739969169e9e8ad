"""A step's lease per queue: a liveness lease, bounded by the queue's redelivery horizon.

The horizon is how long the broker waits before it hands an unacknowledged
message to another worker (Redis/SQS visibility timeout, RabbitMQ consumer
timeout, the SQLite broker's visibility timeout, or pikku's per-queue
override). The lease never exceeds it, so the broker never redelivers a step
whose lease is held. Within it the lease is ``step_lease``: short, renewed at
half its length, so a dead worker's step is taken over within a minute and
not after the horizon.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from ..broker.sqlite import DEFAULT_VISIBILITY_TIMEOUT as SQLITE_DEFAULT_VISIBILITY
from ..ports.lease import positive_seconds

log = logging.getLogger(__name__)

REDIS_DEFAULT_VISIBILITY = 3600.0  # kombu's default for Redis
SQS_DEFAULT_VISIBILITY = 1800.0  # kombu's default for SQS
AMQP_DEFAULT_LEASE = 1800.0  # RabbitMQ's default consumer_timeout (30 min)
DEFAULT_LEASE = 300.0  # any other transport: pikku's documented default horizon
DEFAULT_STEP_LEASE = 60.0  # the liveness lease a step holds within the horizon
SHORT_LEASE = 2.0

REDIS_TRANSPORTS = {"redis", "rediss", "sentinel"}
SQLITE_TRANSPORTS = {"sqlite-queue", "pikku-sqlite"}
VISIBILITY_TRANSPORTS = REDIS_TRANSPORTS | SQLITE_TRANSPORTS | {"sqs"}
AMQP_TRANSPORTS = {"amqp", "amqps", "pyamqp", "librabbitmq"}


@dataclass(frozen=True)
class QueueLease:
    """A queue's step lease (``seconds``), why it is that long (``source``),
    and what it was chosen from: the queue's redelivery horizon (and where
    that came from) and ``step_lease``."""

    queue: str
    seconds: float
    source: str
    horizon: float
    horizon_source: str
    step_lease: float

    @property
    def renewal(self) -> float:
        """How often a running step renews it (seconds): at half its length."""
        return self.seconds / 2


def transport_name(app: Any) -> str:
    """The broker transport's alias, read from configuration (no connection)."""
    transport = app.conf.broker_transport
    if transport and isinstance(transport, str):
        if transport.startswith("pikku_celery.broker.sqlite"):
            return "sqlite-queue"
        return transport.lower()
    url = app.conf.broker_write_url or app.conf.broker_url or "amqp://"
    if isinstance(url, (list, tuple)):
        url = url[0]
    scheme = str(url).split("://", 1)[0].lower()
    return scheme.split("+", 1)[0]


class QueueLeases:
    """Resolves and caches the lease of each queue of a Celery app.

    The horizon, in order: pikku's per-queue override; the transport's
    visibility timeout (Redis/SQS/SQLite broker:
    ``broker_transport_options['visibility_timeout']``, else the transport's
    default); RabbitMQ: the queue's ``x-consumer-timeout`` argument from
    ``task_queues``, else RabbitMQ's default; else ``default`` or
    :data:`DEFAULT_LEASE`. The lease is ``min(horizon, step_lease)``.
    """

    def __init__(
        self,
        app: Any,
        overrides: dict[str, float] | None = None,
        default: float | None = None,
        step_lease: float = DEFAULT_STEP_LEASE,
    ) -> None:
        self.app = app
        self.overrides = {
            name: positive_seconds(seconds, f"queue_leases[{name!r}]")
            for name, seconds in (overrides or {}).items()
        }
        self.default = None if default is None else positive_seconds(default, "default_lease")
        self.step_lease = positive_seconds(step_lease, "step_lease")
        self._cache: dict[str, QueueLease] = {}
        self._lock = threading.Lock()

    def default_queue(self) -> str:
        """The app's default queue (``task_default_queue``, else ``celery``)."""
        return str(self.app.conf.task_default_queue or "celery")

    def lease(self, queue: str | None) -> QueueLease:
        """The step lease of ``queue`` and its source, resolved once and cached."""
        name = queue or self.default_queue()
        cached = self._cache.get(name)
        if cached is not None:
            return cached
        resolved = self._resolve(name)
        if resolved.seconds < SHORT_LEASE:
            log.warning(
                "queue %r gives steps a lease of %.3f s (%s), under %.0f s: it is renewed "
                "at half its length anyway; raise the visibility timeout for fewer renewals",
                name,
                resolved.seconds,
                resolved.source,
                SHORT_LEASE,
            )
        with self._lock:
            self._cache[name] = resolved
        return resolved

    def _resolve(self, queue: str) -> QueueLease:
        horizon, source = self._horizon(queue)
        step_lease = self.step_lease
        seconds = min(horizon, step_lease)
        why = f"min of {source} {horizon:g} s and step_lease {step_lease:g} s"
        return QueueLease(queue, seconds, why, horizon, source, step_lease)

    def _horizon(self, queue: str) -> tuple[float, str]:
        """How long the broker keeps an unacknowledged message of ``queue``
        from other workers, and where that number came from."""
        if queue in self.overrides:
            return self.overrides[queue], "pikku queue_leases"
        transport = transport_name(self.app)
        options = self.app.conf.broker_transport_options or {}
        if transport in VISIBILITY_TRANSPORTS:
            if options.get("visibility_timeout") is not None:
                return (
                    positive_seconds(options["visibility_timeout"], "visibility_timeout"),
                    "broker_transport_options['visibility_timeout']",
                )
            if transport == "sqs":
                return SQS_DEFAULT_VISIBILITY, "kombu's SQS default visibility timeout"
            if transport in REDIS_TRANSPORTS:
                return REDIS_DEFAULT_VISIBILITY, "kombu's Redis default visibility timeout"
            if transport in SQLITE_TRANSPORTS:
                return SQLITE_DEFAULT_VISIBILITY, "the SQLite broker's default visibility timeout"
        if transport in AMQP_TRANSPORTS:
            timeout = self._consumer_timeout(queue)
            if timeout is not None:
                return timeout, "task_queues x-consumer-timeout"
            if self.default is None:
                return AMQP_DEFAULT_LEASE, "RabbitMQ's default consumer_timeout"
        if self.default is not None:
            return self.default, "pikku default_lease"
        return DEFAULT_LEASE, "pikku's default horizon"

    def _consumer_timeout(self, queue: str) -> float | None:
        for q in self.app.conf.task_queues or ():
            if getattr(q, "name", None) != queue:
                continue
            args = getattr(q, "queue_arguments", None) or {}
            if "x-consumer-timeout" in args:
                return float(args["x-consumer-timeout"]) / 1000.0
        return None

    def table(self, queues: list[str] | None = None) -> list[QueueLease]:
        """Every known queue's lease: for the CLI and for operators."""
        names = set(queues or [])
        names.add(self.default_queue())
        names.update(self.overrides)
        for q in self.app.conf.task_queues or ():
            if getattr(q, "name", None):
                names.add(q.name)
        return [self.lease(n) for n in sorted(names)]

    def longest_horizon(self) -> float:
        """The longest horizon of any known queue, and never under ``step_lease``:
        no worker of a fleet sharing either setting grants a longer lease."""
        return max([self.step_lease, *(lease.horizon for lease in self.table())])
