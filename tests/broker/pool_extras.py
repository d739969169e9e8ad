"""Extras for a test worker whose pool processes get killed.

Loaded through ``PIKKU_T_EXTRA`` (see :mod:`tests.celery.realapp`):

* busy marks: a file ``busy/<pid>`` exists under ``PIKKU_T_MARKS`` while that
  pool process runs a task, so a test can tell an idle pool process from a
  busy one without the control API (which the SQLite broker, having no
  broadcast, does not serve);
* workflows whose steps are retried, so a step whose process is killed runs
  again instead of failing its run.

Importing it also registers the ``sqlite-queue://`` scheme, which
:mod:`tests.celery.realapp` does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun

import pikku_celery.broker  # noqa: F401  (registers sqlite-queue://)
from pikku_celery import Context, Pikku

CHAIN = "pool.chain"
SLOW = "pool.slow"
RETRIES = 8  # more than the kills one step can meet in a test


def busy_dir(marks: Path) -> Path:
    """Where the busy marks of the worker's processes live."""
    return marks / "busy"


def busy_pids(marks: Path) -> set[int]:
    """Pids of the pool processes running a task now."""
    directory = busy_dir(marks)
    return {int(p.name) for p in directory.iterdir()} if directory.exists() else set()


def chain_output(i: int) -> int:
    """What :data:`CHAIN` returns for ``i``."""
    return sum(2 * (i + k) for k in range(3))


def install(app: Celery, pikku: Pikku, env: Mapping[str, str]) -> None:
    """Connect the busy marks (inherited by forked pool processes); add the workflows."""
    directory = busy_dir(Path(env["PIKKU_T_MARKS"]))
    directory.mkdir(parents=True, exist_ok=True)

    def started(**_: Any) -> None:
        (directory / str(os.getpid())).touch()

    def finished(**_: Any) -> None:
        (directory / str(os.getpid())).unlink(missing_ok=True)

    task_prerun.connect(started, weak=False)
    task_postrun.connect(finished, weak=False)

    @app.task(name="pool.double", shared=False)
    def double(i: int) -> int:
        return i * 2

    @app.task(name="pool.work", shared=False)
    def work(key: str, seconds: float) -> str:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)  # the work itself, not synchronisation
        return key

    @pikku.workflow(name=CHAIN)
    def chain(ctx: Context, i: int) -> Any:
        return sum(ctx.step(f"s{k}", double, i + k, retries=RETRIES) for k in range(3))

    @pikku.workflow(name=SLOW)
    def slow(ctx: Context, job: dict[str, Any]) -> Any:
        return ctx.step("work", work, job["key"], job["seconds"], retries=RETRIES)
