"""Workflows live wherever Celery finds tasks: import those modules first.

``celery worker`` imports a project's task modules before it consumes
(``app.loader.import_default_modules()``: the ``imports`` and ``include``
settings, and every package given to ``app.autodiscover_tasks``, Django's
installed apps among them). A process that is not a worker (the CLI, a web
process starting a run by name, the run page) has not, so a workflow defined
in such a module is not registered there until the same import happens.
"""

from __future__ import annotations

from celery import Celery


def import_task_modules(app: Celery) -> str:
    """Import the modules ``celery worker`` would import for ``app``; say
    which (for an error naming where a workflow was looked for)."""
    loader = app.loader
    loader.import_default_modules()
    named = [str(m) for m in loader.default_modules if not str(m).startswith("celery.")]
    found = sorted(
        {
            str(task.__module__)
            for name, task in list(app.tasks.items())
            if not name.startswith(("celery.", "pikku.", "pikku_"))
        }
    )
    return (
        f"the modules Celery imports for app {app.main!r} (imports/include: "
        f"{', '.join(named) or 'none'}; app.autodiscover_tasks and the modules "
        f"defining its tasks: {', '.join(found) or 'none'})"
    )
