"""pytest-celery's ``celery_worker`` node fixture, for the tests of this folder.

tests/conftest.py loads ``celery.contrib.pytest``, whose in-process
``celery_worker`` has the same name and would otherwise stand in its place.
"""

from pytest_celery import celery_worker

__all__ = ["celery_worker"]
