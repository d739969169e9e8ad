"""The engine is pure logic over its ports: importing it loads no adapter's library.

A process that only starts runs through its own adapters (a test with the
in-memory ones, a tool reading runs) must not pay for Celery, SQLAlchemy,
Redis, a database driver or OpenTelemetry, nor fail for lack of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("celery", "kombu", "sqlalchemy", "redis", "psycopg", "pymysql", "opentelemetry")


def loaded_after(statement: str) -> list[str]:
    """Which of HEAVY a fresh interpreter has loaded after ``statement``."""
    report = f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    probe = f"import sys, json\n{statement}\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize(
    "statement",
    [
        "import pikku_celery.engine",
        "from pikku_celery.engine import WorkflowEngine, Context, RunHandle",
        "from pikku_celery.store import InMemoryWorkflowStore, RunStatus",
        "from pikku_celery.lease import InMemoryLeaseService, hold_lease",
        "from pikku_celery import Context, RunStatus, WorkflowFailedError",
    ],
)
def test_the_engine_and_its_memory_adapters_load_no_adapter_library(statement: str) -> None:
    assert loaded_after(statement) == []


def test_the_celery_integration_is_still_one_import_away() -> None:
    assert set(loaded_after("from pikku_celery import Pikku")) >= {"celery", "sqlalchemy"}
    assert "opentelemetry" not in loaded_after("from pikku_celery import Pikku")
    assert "opentelemetry" in loaded_after("import pikku_celery.tracing")
    assert "sqlalchemy" in loaded_after("from pikku_celery.store import SQLWorkflowStore")
