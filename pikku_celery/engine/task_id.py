"""A step's fixed task id (what its task sees as ``self.request.id``) and
its own time limits, kept in its route.

A step's attempts each get their own request id, unless the step was
recorded with one (a canvas node whose id the caller chose or will look up:
``AsyncResult(id)``). It is kept in the step's route under :data:`TASK_ID`
(the route is stored with the step; only routing keys reach the broker).
"""

from __future__ import annotations

TASK_ID = "task_id"
"""The key of a step's route that holds the id its task sees as ``request.id``."""

TIME_LIMITS = ("time_limit", "soft_time_limit")
"""The keys of a step's route that hold its own per-message time limits."""

DELAYED = "delayed"
"""The key of a step's route that says it ran after a delay (a canvas node's
``countdown``/``eta``): its request's ``eta`` is when it became due."""

EXTRAS = "extras"
"""The key of a step's route that holds request fields of the step's own,
opaque to the engine: what the caller (a canvas node) wants its task's
request to carry, which the Celery layer applies to the request and the
step's message."""
