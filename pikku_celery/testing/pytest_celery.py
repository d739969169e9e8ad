"""pytest-celery without Docker: its setup API on local workers and running servers.

Load it with ``-p pikku_celery.testing.pytest_celery`` (``addopts`` in your
pytest configuration) or ``pytest_plugins = ["pikku_celery.testing.pytest_celery"]``
in the rootdir's ``conftest.py``. It is not loaded on its own: it replaces
pytest-celery's Docker components, which is a choice to make, not a side
effect of installing pikku-celery.

pytest-celery's fixtures then build their setup from local nodes (see
:mod:`pikku_celery.testing.nodes.fixtures`): each worker is a ``celery
worker`` process, each Redis broker or backend a key prefix of its own on a
running Redis, each RabbitMQ broker a virtual host on a running RabbitMQ.
Where those servers are, and where the store of the ``celery_setup_pikku``
fixture is made, come from ini options or environment variables (see
:mod:`pikku_celery.testing.nodes.settings`).

The fixtures are registered when pytest is configured, after every plugin
loaded at startup (pytest-celery's own entry point included), so they win
over pytest-celery's whatever the order the plugins were loaded in; a
``conftest.py`` fixture of the same name still wins over them.
"""

from __future__ import annotations

import importlib.util

import pytest

FIXTURES = "pikku_celery.testing.nodes.fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    """The plugin's ini options (see :mod:`.nodes.settings`)."""
    from .nodes.settings import add_ini_options

    add_ini_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Put the local nodes' fixtures in place of pytest-celery's Docker ones."""
    if importlib.util.find_spec("pytest_celery") is None:
        raise pytest.UsageError(
            "pikku_celery.testing.pytest_celery needs pytest-celery: pip install pytest-celery"
        )
    from .nodes.settings import NodeSettings

    NodeSettings.from_config(config)  # a bad setting fails the session at once, named
    if not config.pluginmanager.has_plugin(FIXTURES):
        from .nodes import fixtures

        config.pluginmanager.register(fixtures, FIXTURES)
