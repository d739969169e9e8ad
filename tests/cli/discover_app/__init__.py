"""A project whose workflows Celery finds through ``app.autodiscover_tasks``."""
