"""Management commands of the pikku-celery Django app."""
