"""Real ``celery worker`` and ``celery beat`` processes for the tests: pikku's local nodes.

:func:`worker` and :func:`beat` start one of the app module ``app_module``
(``celery -A``; :mod:`tests.celery.realapp` unless told) and return its
pytest-celery node: ``kill(signal)`` (SIGKILL by default, SIGSTOP/SIGCONT
too), ``logs()``, ``wait_for_log()``, ``hostname()``, ``stop()``. The
:class:`CeleryProcess` names this project's tests have used (``log()``,
``wait_ready()``, ``log_path``, ``proc``; a ``with`` block stops it) stay.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pytest_celery import CeleryTestNode

from pikku_celery.testing.nodes import (
    LocalBeatContainer,
    LocalProcessContainer,
    LocalWorkerContainer,
)
from pikku_celery.testing.nodes.api import FastLogs, LocalTestWorker

ROOT = Path(__file__).resolve().parents[2]
APP_MODULE = "tests.celery.realapp"


class CeleryProcess(CeleryTestNode):
    """A node of a local celery process (worker or beat), with the names the tests use."""

    container: LocalProcessContainer

    @property
    def log_path(self) -> Path:
        return self.container.log_path

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.container.process.proc

    @property
    def pid(self) -> int | None:
        """The process group's id (its leader's pid)."""
        return self.container.pid

    def start(self) -> CeleryProcess:
        self.container.start()
        return self

    def log(self) -> str:
        return self.logs()

    def wait_ready(self, timeout: float = 30.0) -> CeleryProcess:
        """Wait for the ready line; AssertionError (with the log) if it does not come."""
        try:
            self.container.ready(timeout)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(str(exc)) from None
        return self

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL after ``timeout`` seconds."""
        self.container.stop(timeout)

    def __enter__(self) -> CeleryProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class WorkerProcess(CeleryProcess, LocalTestWorker):
    """A ``celery worker`` node."""

    container: LocalWorkerContainer


class BeatProcess(CeleryProcess, FastLogs):
    """A ``celery beat`` node."""

    container: LocalBeatContainer


def worker(
    env: Mapping[str, str],
    queues: list[str],
    log: Path,
    name: str,
    concurrency: int = 1,
    *,
    app_module: str = APP_MODULE,
    container_cls: type[LocalWorkerContainer] = LocalWorkerContainer,
    **options: Any,
) -> WorkerProcess:
    """Start a prefork ``celery worker`` of ``app_module`` on ``queues``, node
    ``name``, its log in ``log``; ``options`` go to its container."""
    container = container_cls(
        app_module,
        queues=queues,
        worker_name=name,
        concurrency=concurrency,
        env=env,
        log_path=log,
        cwd=ROOT,
        **options,
    )
    node = WorkerProcess(container, app=None)
    node.start()
    return node


def beat(
    env: Mapping[str, str], workdir: Path, *, app_module: str = APP_MODULE, **options: Any
) -> BeatProcess:
    """Start ``celery beat`` of ``app_module``, its log and schedule in ``workdir``."""
    container = LocalBeatContainer(
        app_module, env=env, log_path=workdir / "beat.log", cwd=ROOT, **options
    )
    node = BeatProcess(container)
    node.start()
    return node
