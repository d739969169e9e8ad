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
from pikku_celery.testing.nodes.worker import BEAT_READY, WORKER_READY

ROOT = Path(__file__).resolve().parents[2]
APP_MODULE = "tests.celery.realapp"


class ArgvContainer(LocalProcessContainer):
    """A celery process of ``celery -A app_module ARGV``: worker or beat, by ``argv[0]``."""

    def __init__(self, app_module: str, argv: list[str], **options: Any) -> None:
        super().__init__(app_module, argv, **options)
        self.ready_prompt = WORKER_READY if argv[:1] == ["worker"] else BEAT_READY


class CeleryProcess(CeleryTestNode):
    """A node of a local celery process (worker or beat), with the names the tests use.

    Also made the way this module's callers once made their processes,
    ``CeleryProcess(worker_argv(...), env, log)`` with the class's
    ``app_module``, then ``.start()``.
    """

    app_module = APP_MODULE
    container: LocalProcessContainer

    def __init__(
        self,
        container: LocalProcessContainer | list[str],
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        app: Any = None,
    ) -> None:
        if isinstance(container, list):
            container = ArgvContainer(self.app_module, container, env=env, log_path=log, cwd=ROOT)
        super().__init__(container, app)

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
    node = WorkerProcess(container)
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


def worker_argv(queues: list[str], name: str, concurrency: int = 1) -> list[str]:
    """``celery worker`` arguments (prefork, ``queues``, node ``name``, INFO log),
    for ``CeleryProcess(argv, env, log)``."""
    return [
        "worker",
        "--pool",
        "prefork",
        "-c",
        str(concurrency),
        "-Q",
        ",".join(queues),
        "-n",
        f"{name}@%h",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]


def beat_argv(workdir: Path) -> list[str]:
    """``celery beat`` arguments, its schedule file in ``workdir``."""
    return ["beat", "--loglevel", "INFO", "-s", str(workdir / "beat-schedule")]
