"""Testing workflows: no broker, no database, no waiting.

* :func:`workflow_test_env` (:class:`WorkflowTestEnv`): *your own* Pikku's
  workflows, for the duration of a ``with``, on an engine of the
  environment's own (:mod:`pikku_celery.testing.own_engine`): an in-memory
  store and a virtual clock that skips ahead whenever nothing is due now;
  your Celery tasks run as steps the way a worker runs them. See :mod:`pikku_celery.testing.env`.
* The pytest plugin :mod:`pikku_celery.testing.pytest_plugin` (registered
  through the ``pytest11`` entry point): the ``pikku_test_env`` fixture.
* The pytest plugin :mod:`pikku_celery.testing.pytest_celery` (loaded with
  ``-p``): pytest-celery's setup API without Docker, on local worker
  processes and running servers (:mod:`pikku_celery.testing.nodes`), and the
  ``celery_setup_pikku`` fixture.
* :class:`InlineDispatcher` and :func:`make_engine`: a bare engine on
  in-memory adapters with a local queue on the real clock, for testing the
  engine itself (see :mod:`pikku_celery.testing.inline`).
"""

from .env import (
    SentTask,
    VirtualClock,
    WorkflowStuckError,
    WorkflowTestDispatcher,
    WorkflowTestEnv,
    WorkflowTestStore,
    workflow_test_env,
)
from .inline import InlineDispatcher, Message, make_engine

__all__ = [
    "InlineDispatcher",
    "Message",
    "SentTask",
    "VirtualClock",
    "WorkflowStuckError",
    "WorkflowTestDispatcher",
    "WorkflowTestEnv",
    "WorkflowTestStore",
    "make_engine",
    "workflow_test_env",
]
