"""A Celery module that imports its workflows, which call ``get_pikku()`` at import.

The usual layout of a Django project: ``proj/celery.py`` imports
``proj/workflows.py`` so the worker registers them; the workflows module
asks for the Pikku while ``proj/celery.py`` is still being imported.
"""

from __future__ import annotations

from celery import Celery

from pikku_celery.contrib.django import get_pikku

app = Celery("reentrant", broker="memory://", set_as_current=False)

pikku = get_pikku()  # what `from proj import workflows` would do here
