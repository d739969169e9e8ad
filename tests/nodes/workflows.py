"""A workflow for the node tests, installed on the setup's Pikku and in its workers.

``install`` is what ``celery_setup_pikku_installers`` names: the test process
and every worker node call it on their Pikku, so both know the same task and
workflow.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from pikku_celery import Context, Pikku


def install(pikku: Pikku) -> None:
    @pikku.app.task(name="nodes.hang_first", shared=False)
    def hang_first(marks: str, key: str) -> int:
        """The first attempt marks its pid and hangs until killed; later ones return theirs."""
        mark = Path(marks) / f"{key}.pid"
        if not mark.exists():
            mark.write_text(str(os.getpid()))
            threading.Event().wait(600)
        return os.getpid()

    @pikku.workflow(name="nodes.takeover")
    def takeover(ctx: Context, job: dict[str, Any]) -> Any:
        return ctx.step("hang", hang_first, job["marks"], job["key"], retries=2)
