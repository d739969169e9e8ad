"""pikku's messages through a store outage: never lost, taken again.

A step or orchestrate message is acked late, and Celery acks a task that
raises just as one that returns: a message whose claim or pass could not
reach the database would be gone, and only the sweep would send it again,
after ``message_grace``. So the task rides the outage out in place first
(the message stays unacked meanwhile: a worker lost now gives it back to the
broker), and when the outage outlasts that, publishes the message again with
a countdown that grows with each round, before its own is acked.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

log = logging.getLogger(__name__)

FIRST_COUNTDOWN = 1.0
MAX_COUNTDOWN = 30.0
"""A database away for longer than the in-place wait is not back at once:
later rounds come less often, never further apart than this."""


def redeliver_later(task: Any, exc: Exception, bound: float) -> NoReturn:
    """Publish the message ``task`` is running again, due after a countdown
    of at most ``bound`` seconds (under the queue's redelivery horizon), and
    end this delivery. Run in process (``task_always_eager``), there is
    nobody to hand it to: ``exc`` is raised to the caller."""
    request = task.request
    if request.is_eager or request.called_directly:
        raise exc
    rounds = int(request.retries or 0)
    countdown = min(FIRST_COUNTDOWN * 2 ** min(rounds, 16), MAX_COUNTDOWN, bound)
    log.warning(
        "%s %r: the store is unavailable; the message is sent again in %.1f s (round %d): %s",
        task.name,
        request.args,
        countdown,
        rounds + 1,
        exc,
    )
    raise task.retry(exc=exc, countdown=countdown)
