"""What the worker process running pikku's tasks can run eagerly.

An eager step runs in the process that finished the step before it, so that
process must be a worker that consumes the step's queue, and must not be
shutting down. Both are learned from Celery's worker signals in the worker's
main process, before its pool forks: the queues from ``worker_init`` (after
``-Q``/``-X`` were applied; ``celeryd_after_setup`` handlers may change them,
so they are read again there), the warm shutdown from
``worker_shutting_down``, kept in a byte of shared memory so that prefork
children see it too.
"""

from __future__ import annotations

import mmap
from typing import Any

from celery import Celery, signals


class WorkerProcess:
    """The consumed queues and the shutdown flag of this app's worker."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.consumed: frozenset[str] | None = None
        """The queues this worker consumes; None outside a worker."""
        # Anonymous and shared: a prefork child forked after this sees the
        # main process's writes (a 1-byte page, never resized).
        self._stopping = mmap.mmap(-1, 1)
        signals.worker_init.connect(self._worker_init, weak=False)
        signals.celeryd_after_setup.connect(self._after_setup, weak=False)
        signals.worker_shutting_down.connect(self._shutting_down, weak=False)

    @property
    def stopping(self) -> bool:
        """Whether this worker is shutting down (its last tasks are finishing)."""
        return self._stopping[0] == 1

    def consumes(self, queue: str | None) -> bool:
        """Whether this worker takes messages from ``queue``."""
        return queue is not None and self.consumed is not None and queue in self.consumed

    def _learn_queues(self, app: Any) -> None:
        if app is self.app:
            self.consumed = frozenset(app.amqp.queues.consume_from)
            self._stopping[0] = 0

    def _worker_init(self, sender: Any = None, **_: Any) -> None:
        self._learn_queues(getattr(sender, "app", None))

    def _after_setup(self, instance: Any = None, **_: Any) -> None:
        self._learn_queues(getattr(instance, "app", None))

    def _shutting_down(self, **_: Any) -> None:
        self._stopping[0] = 1
