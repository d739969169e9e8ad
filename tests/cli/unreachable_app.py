"""An app whose database cannot be reached (nothing listens on port 9)."""

from __future__ import annotations

from celery import Celery

from pikku_celery import Pikku

PASSWORD = "pa55-cli-secret"

app = Celery("unreachable", broker="memory://")
pikku = Pikku(app, f"postgresql+psycopg://pikku:{PASSWORD}@127.0.0.1:9/nowhere")
