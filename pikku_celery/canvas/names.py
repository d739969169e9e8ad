"""The names a durable canvas run is known by (no Celery needed to read them)."""

from __future__ import annotations

WORKFLOW = "pikku.canvas"
"""The built-in workflow whose runs are durable canvases (their input: the plan)."""

ROOT = "canvas"
"""The path of the plan's root node; every node's step name starts with it."""

COUNTDOWN = ".countdown"
"""The suffix of a node's countdown timer step (``canvas.0.countdown``)."""

ERRBACK_TASK = "pikku_canvas.errback"
"""pikku's task that calls a new-style errback ``(request, exc, traceback)``."""

FAIL_UNRUN_TASK = "pikku_canvas.fail_unrun"
"""pikku's task that marks the result ids of canvas nodes that will never run
(after a chord's header failed) failed, as Celery's result backend does."""
