"""pytest fixtures for testing your workflows: ``pikku_test_env``.

Installed with pikku-celery and loaded by pytest on its own (the package's
``pytest11`` entry point). With plugin autoloading off
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), load it with
``-p pikku_celery.testing.pytest_plugin`` or, in the rootdir's
``conftest.py``, ``pytest_plugins = ["pikku_celery.testing.pytest_plugin"]``.

Tell it which Pikku is yours in one of two ways:

* the ``pikku_app`` ini option, e.g. ``pikku_app = "proj.celery:pikku"``
  under ``[tool.pytest.ini_options]`` (``MODULE:ATTR``, or a ``MODULE``
  holding exactly one Pikku), or
* a ``pikku`` fixture of your own in ``conftest.py`` returning it.

Fixtures:

* ``pikku``: your Pikku, as ``pikku_app`` names it (override it to choose).
* ``pikku_test_env``: a :class:`~pikku_celery.testing.WorkflowTestEnv`
  entered on ``pikku`` for the test, and left (the real store and
  dispatcher restored) after it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported by the fixtures: loading the plugin imports nothing else
    from ..engine.core import WorkflowEngine
    from .env import WorkflowTestEnv

INI_NAME = "pikku_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the ``pikku_app`` ini option."""
    parser.addini(
        INI_NAME,
        "the Pikku the pikku_test_env fixture runs: MODULE:ATTR, or a MODULE holding one",
        default="",
    )


@pytest.fixture
def pikku(request: pytest.FixtureRequest) -> WorkflowEngine:
    """Your Pikku, as the ``pikku_app`` ini option names it; define your own
    ``pikku`` fixture in ``conftest.py`` to choose it in code instead."""
    import click

    from ..cli.app_loader import load_pikku

    spec = str(request.config.getini(INI_NAME) or "").strip()
    if not spec:
        pytest.fail(
            "pikku_test_env needs your Pikku: name it in pytest's configuration "
            '(pikku_app = "proj.celery:pikku" under [tool.pytest.ini_options]) or '
            "return it from a fixture named `pikku` in conftest.py",
            pytrace=False,
        )
    root = str(request.config.rootpath)
    if root not in sys.path:
        sys.path.insert(0, root)  # the project's root, as celery -A makes it importable
    try:
        return load_pikku(spec)  # found as ``pikku-celery -A`` finds it
    except click.ClickException as exc:
        reason = exc.message.removeprefix("-A/--app: ")
        pytest.fail(f"{INI_NAME} = {spec!r}: {reason}", pytrace=False)


@pytest.fixture
def pikku_test_env(pikku: WorkflowEngine) -> Iterator[WorkflowTestEnv]:
    """Your Pikku inside :func:`~pikku_celery.testing.workflow_test_env` for the
    test: in-memory store, virtual clock, no broker; your Pikku's own methods
    are back afterwards."""
    from .env import workflow_test_env

    with workflow_test_env(pikku) as env:
        yield env
