"""The pytest-celery plugin takes a project's module-level workflows as they
are: ``pikku_celery_workflows = "proj.workflows"`` (no ``install`` function).

Registered on the setup's Pikku here and in each worker node; a worker node
of the setup runs a run of one to the end.
"""

from __future__ import annotations

import types

import pytest
from pytest_celery import CeleryTestSetup

from pikku_celery import Pikku
from pikku_celery.testing import make_engine
from pikku_celery.testing.nodes.app import install_all
from tests.nodes import module_workflows

pytestmark = pytest.mark.slow


@pytest.fixture
def celery_setup_pikku_installers() -> list[str]:
    return ["tests.nodes.module_workflows"]


def test_a_module_s_workflows_are_registered_as_they_are() -> None:
    target, _ = make_engine()
    install_all(target, ["tests.nodes.module_workflows"])
    greet = target.registry.get("userland.greet")
    assert greet.fn is module_workflows.greet.fn and greet.engine is target
    assert [w.version for w in target.registry.versions("userland.versioned")] == ["2", "1"]
    # The module's own objects stay its Pikku's.
    assert module_workflows.greet.engine is module_workflows.pikku
    again, _ = make_engine()
    install_all(again, ["tests.nodes.module_workflows:pikku"])  # the Pikku named
    assert again.registry.names() == target.registry.names()


def test_a_module_with_neither_install_nor_a_pikku_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    empty = types.ModuleType("tests.nodes.nothing_here")
    monkeypatch.setitem(__import__("sys").modules, empty.__name__, empty)
    with pytest.raises(LookupError, match=r"nothing_here.*no install\(\) and no Pikku"):
        install_all(make_engine()[0], [empty.__name__])


def test_a_worker_node_runs_a_module_level_workflow(
    celery_setup: CeleryTestSetup, celery_setup_pikku: Pikku
) -> None:
    run = celery_setup_pikku.start(module_workflows.greet, "nodes")
    assert run.wait(timeout=90) == "HELLO NODES"
    [shout] = run.steps()
    assert shout.step.task_name == "userland.shout"
    assert shout.attempts[0].worker is not None
