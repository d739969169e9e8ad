"""Durable canvas reaches the Celery integration only through its registration point.

``lint-imports`` sees import statements; these check what an interpreter
really loads, ``importlib`` included: the integration alone loads no canvas
module, and a Pikku imported from the package has durable canvas installed.
"""

from __future__ import annotations

import json
import subprocess
import sys


def run_fresh(code: str) -> object:
    """What ``code`` prints last (JSON), in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_integration_loads_no_canvas_module() -> None:
    loaded = run_fresh(
        "import json, sys\n"
        "import pikku_celery.celery.integration\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pikku_celery.canvas'))))"
    )
    assert loaded == []


def test_a_pikku_from_the_package_has_durable_canvas() -> None:
    installed = run_fresh(
        "import json\n"
        "from celery import Celery\n"
        "from pikku_celery import Pikku\n"
        "from pikku_celery.canvas.names import ERRBACK_TASK, WORKFLOW\n"
        "from pikku_celery.store import InMemoryWorkflowStore\n"
        "app = Celery('registration', broker='memory://')\n"
        "pikku = Pikku(app, store=InMemoryWorkflowStore(), install_beat=False)\n"
        "print(json.dumps([pikku.registry.get(WORKFLOW).name, ERRBACK_TASK in app.tasks]))"
    )
    assert installed == ["pikku.canvas", True]
