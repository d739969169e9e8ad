"""The shop's tests run its own Pikku in pikku-celery's test environment.

pikku-celery's pytest plugin (loaded by pytest through its entry point)
gives the ``pikku_test_env`` fixture; this says which Pikku it runs. The
same could be said with ``pikku_app = "example_project.app:pikku"`` in
pytest's configuration, and no conftest at all.
"""

import pytest

# The pytest-celery node behind ``celery_setup``. Only needed in this repository,
# whose tests/conftest.py loads celery.contrib.pytest: its in-process worker
# fixture has the same name, ``celery_worker``.
from pytest_celery import celery_worker

from example_project.app import pikku as shop_pikku
from pikku_celery import Pikku

__all__ = ["celery_worker"]


@pytest.fixture
def pikku() -> Pikku:
    """The shop's Pikku, as its workers use it."""
    return shop_pikku
