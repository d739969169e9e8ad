"""A pytest plugin: the suite on pytest-xdist workers (``-n 2 --dist loadgroup``).

Much of the suite waits: on real workers, on leases running out, on servers
starting. Two worker processes overlap that waiting. Each worker is a pytest
session of its own (its own databases and Redis prefix: tests/services.py).

With ``--dist loadgroup`` a worker gets a whole module at a time, so a
module's fixtures (a throwaway server, a cluster of Celery workers) are set
up once, as in a run without xdist. The modules that must not run beside each
other share a group (:data:`GROUPS`): a group goes to one worker, which runs
its modules one after another. An ``xdist_group`` marker still names a group
of its own.

Work units are handed out in collection order, so each worker runs its
modules in the order a run without xdist runs them (a group's modules run
together, where its first one would): a module that leaves process-wide
state behind precedes the same modules as it always did. Handing the longest
units out first, for a shorter tail, put modules before others they never
preceded, and a log-capturing test (tests/engine/test_transactional.py)
then saw no log at all.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling
    from xdist.workermanage import WorkerController

COLUMNS_KEY = "pikku_columns"

GROUPS: dict[str, tuple[str, ...]] = {
    # Network namespaces, a bridge and addresses on fixed names (a file lock
    # makes a second run wait for the first).
    "hosts": ("tests/reliability/hosts/",),
    # One cluster per session (a beat and three workers, alive to the end):
    # the modules that share it, on one worker, start it once.
    "shared-canvas": tuple(
        f"tests/canvas/test_{name}.py"
        for name in (
            "add_to_chord",
            "celery_rules",
            "errbacks_once",
            "ids",
            "large_group",
            "payloads",
            "replace",
            "request_fields",
            "result_tree",
        )
    ),
    # One headless Chromium per session: the pages' tests share it.
    "browser": (
        "tests/web/test_browser.py",
        "tests/web/test_canvas_page.py",
        "tests/web/test_continued_page.py",
    ),
}


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: its group, else its module."""
    at = nodeid.rfind("@")
    if at > nodeid.rfind("]"):  # an xdist_group marker's name, as loadgroup reads it
        return nodeid[at + 1 :]
    module = nodeid.split("::", 1)[0]
    for group, prefixes in GROUPS.items():
        if module.startswith(prefixes):
            return group
    return module


def grouping(config: pytest.Config) -> bool:
    return bool(config.getvalue("dist") == "loadgroup")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """``--dist loadgroup``: modules and the groups above, in collection order."""
    if not grouping(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    # Handed out in collection order, not by size (see the docstring above).
    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def pytest_configure(config: pytest.Config) -> None:
    """One string-hash seed for the run's workers, a new one each run: the
    workers must collect the same tests in the same order, and some
    parametrizations are built from sets (pytest-celery's brokers).

    A worker's environment gains a ``COLUMNS`` while it starts; the CLI
    reads one as a terminal's width (and draws narrow tables), so a worker
    keeps the run's own, or none."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        columns = workerinput.get(COLUMNS_KEY)
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    elif config.getoption("numprocesses", None):
        os.environ.setdefault("PYTHONHASHSEED", str(random.randrange(1, 2**32)))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: WorkerController) -> None:
    """What a worker needs of the run's environment (see pytest_configure)."""
    node.workerinput[COLUMNS_KEY] = os.environ.get("COLUMNS")
