"""A Celery app without a Pikku: -A must say what it looked for."""

from __future__ import annotations

from celery import Celery

app = Celery("no_pikku", broker="memory://")
