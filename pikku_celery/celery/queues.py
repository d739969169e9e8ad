"""The lease of a step is the redelivery horizon of the queue it came through.

If the broker would hand the message to another worker after N seconds, the
step's lease is N seconds too: broker and database then agree on who owns it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

REDIS_DEFAULT_VISIBILITY = 3600.0  # kombu's default for Redis
SQS_DEFAULT_VISIBILITY = 1800.0  # kombu's default for SQS
AMQP_DEFAULT_LEASE = 1800.0  # RabbitMQ's default consumer_timeout (30 min)
DEFAULT_LEASE = 300.0  # any other transport: pikku's documented default
SHORT_LEASE = 2.0

VISIBILITY_TRANSPORTS = {"redis", "rediss", "sentinel", "sqs", "sqlite-queue", "pikku-sqlite"}
AMQP_TRANSPORTS = {"amqp", "amqps", "pyamqp", "librabbitmq"}


@dataclass(frozen=True)
class QueueLease:
    """A queue's step lease and where that number came from."""

    queue: str
    seconds: float
    source: str


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

    Order: pikku's per-queue override; the transport's visibility timeout
    (Redis/SQS: ``broker_transport_options['visibility_timeout']``, else
    kombu's default); RabbitMQ: the queue's ``x-consumer-timeout`` argument
    from ``task_queues``; else :data:`DEFAULT_LEASE`.
    """

    def __init__(
        self,
        app: Any,
        overrides: dict[str, float] | None = None,
        default: float | None = None,
    ) -> None:
        self.app = app
        self.overrides = dict(overrides or {})
        self.default = default
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
                "queue %r gives steps a lease of %.3f s (from %s), under %.0f s: it is renewed "
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
        if queue in self.overrides:
            return QueueLease(queue, float(self.overrides[queue]), "pikku queue_leases")
        transport = transport_name(self.app)
        options = self.app.conf.broker_transport_options or {}
        if transport in VISIBILITY_TRANSPORTS:
            if options.get("visibility_timeout") is not None:
                return QueueLease(
                    queue,
                    float(options["visibility_timeout"]),
                    "broker_transport_options['visibility_timeout']",
                )
            if transport == "sqs":
                return QueueLease(queue, SQS_DEFAULT_VISIBILITY, "kombu's SQS default")
            if transport in ("redis", "rediss", "sentinel"):
                return QueueLease(queue, REDIS_DEFAULT_VISIBILITY, "kombu's Redis default")
        if transport in AMQP_TRANSPORTS:
            timeout = self._consumer_timeout(queue)
            if timeout is not None:
                return QueueLease(queue, timeout, "task_queues x-consumer-timeout")
            if self.default is None:
                return QueueLease(queue, AMQP_DEFAULT_LEASE, "RabbitMQ's default consumer_timeout")
        if self.default is not None:
            return QueueLease(queue, float(self.default), "pikku default_lease")
        return QueueLease(queue, DEFAULT_LEASE, "pikku's default")

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
