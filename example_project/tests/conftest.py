"""The shop's tests run its own Pikku in pikku-celery's test environment.

pikku-celery's pytest plugin (loaded by pytest through its entry point)
gives the ``pikku_test_env`` fixture; this says which Pikku it runs. The
same could be said with ``pikku_app = "example_project.app:pikku"`` in
pytest's configuration, and no conftest at all.
"""

import pytest

from example_project.app import pikku as shop_pikku
from pikku_celery import Pikku


@pytest.fixture
def pikku() -> Pikku:
    """The shop's Pikku, as its workers use it."""
    return shop_pikku
