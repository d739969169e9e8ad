"""A step that runs until the test releases it, for the rolling-deploy test.

``realapp.build`` calls :func:`install` when ``PIKKU_T_EXTRA`` names this
module. Each execution of the body leaves a mark ``<key>.<pid>.run`` in
``PIKKU_T_MARKS`` (so the test counts executions across processes), then waits
for ``<key>.release`` to appear.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))

    @app.task(name="t.hold_until_released", shared=False)
    def hold_until_released(key: str) -> str:
        """Runs until the test releases it (polling a file: it is another process)."""
        (marks / f"{key}.{os.getpid()}.run").write_text("")
        deadline = time.monotonic() + 600
        while not (marks / f"{key}.release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return f"released {key}"

    @pikku.workflow(name="t.deploy")
    def deploy(ctx: Context, key: str) -> Any:
        return ctx.step("hold", hold_until_released, key, retries=2)
