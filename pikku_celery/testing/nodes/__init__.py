"""Local stand-ins for pytest-celery's Docker containers.

* :class:`LocalWorkerContainer`, :class:`LocalBeatContainer`: ``celery
  worker`` / ``celery beat`` of an app module as a local process group, its
  log in a file (:mod:`.worker`, over :class:`LocalProcess`);
* :class:`LocalRedisContainer`, :class:`LocalRabbitMQContainer`: a broker or
  result backend on a server that is already running (:mod:`.services`);
* :func:`scratch_database`: a pikku store made for a test session (:mod:`.store`).

The node classes wrapping them for pytest-celery's setup (they import
pytest-celery) are in :mod:`.api`; the pytest plugin is
:mod:`pikku_celery.testing.pytest_celery`.
"""

from .container import LocalContainer
from .process import LocalProcess, signal_number
from .services import LocalRabbitMQContainer, LocalRedisContainer, RabbitMQVhost
from .store import scratch_database
from .worker import LocalBeatContainer, LocalProcessContainer, LocalWorkerContainer

__all__ = [
    "LocalBeatContainer",
    "LocalContainer",
    "LocalProcess",
    "LocalProcessContainer",
    "LocalRabbitMQContainer",
    "LocalRedisContainer",
    "LocalWorkerContainer",
    "RabbitMQVhost",
    "scratch_database",
    "signal_number",
]
