"""pikku's messages under ``task_always_eager``: run in this process, never published.

Celery runs an eager task inside ``apply_async``; pikku publishes with
``send_task``, which Celery leaves to the broker even when eager. So under
``task_always_eager`` the dispatcher hands its messages here instead. They
run in the order they were sent, each after the one before it has returned:
the first send in a thread drains the queue, later sends from inside a
running message only append to it, so a long run never nests its steps and
no pass runs inside the pass that sent it. A message with a countdown (a
durable sleep, a retry's delay) is delivered when it is due, from a timer
thread, as a worker would take it from the broker; a run that sleeps for an
hour finishes an hour later (the testing kit's clock skips that time).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from typing import Any

from celery import Celery

from .routes import ROUTING_OPTIONS

log = logging.getLogger(__name__)

Message = tuple[str, tuple[Any, ...], dict[str, Any]]


class InProcessDelivery:
    """Runs messages with ``Task.apply``, one at a time per thread, in order."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._local = threading.local()

    def deliver(
        self, name: str, args: tuple[Any, ...], countdown: float, options: dict[str, Any]
    ) -> None:
        """Run the message now (after those already queued here), or when due."""
        message: Message = (name, args, options)
        if countdown > 0:
            timer = threading.Timer(countdown, self._run_all, (message,))
            timer.name = f"pikku-eager-{name}"
            timer.daemon = True
            timer.start()
            return
        self._run_all(message)

    def _run_all(self, message: Message) -> None:
        queue: deque[Message] | None = getattr(self._local, "queue", None)
        if queue is not None:  # a message running in this thread sent this one
            queue.append(message)
            return
        queue = self._local.queue = deque([message])
        try:
            while queue:
                self._run(*queue.popleft())
        finally:
            self._local.queue = None

    def _run(self, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> None:
        task = self.app.tasks[name]
        result = task.apply(
            args=args,
            task_id=str(uuid.uuid4()),
            headers=options.get("headers"),
            **{k: v for k, v in options.items() if k in ROUTING_OPTIONS},
        )
        if result.failed():
            # pikku's tasks record a step's failure themselves; an error that
            # escapes one is pikku's own and must not pass silently.
            log.error("pikku task %s%r failed in process: %r", name, args, result.result)
