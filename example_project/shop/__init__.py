"""The shop: its Celery tasks and its workflows."""
