"""``celery worker`` and ``celery beat`` as local processes, container-shaped.

A worker's hostname is ``<worker_name>@<first 12 hex of its id>``, which is
what pytest-celery's :meth:`CeleryTestWorker.hostname` computes from a
container, so ``celery_setup.worker.hostname()`` names the real node (for
``app.control.ping(destination=[...])``, say).
"""

from __future__ import annotations

import os
import signal as signals
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import celery

from .container import LocalContainer
from .process import LocalProcess, Signal, signal_number

DEFAULT_WORKER_NAME = "celery_test_worker"
DEFAULT_QUEUE = "celery"
WORKER_READY = "ready."
BEAT_READY = "beat: Starting"


class LocalProcessContainer(LocalContainer):
    """A component that is one local process group (see :class:`LocalProcess`).

    ``command_prefix`` goes before the interpreter (``["faketime", "-f",
    "+1h"]``); ``python_module`` is what ``python -m`` runs: ``celery``, or a
    launcher that takes celery's arguments.
    """

    ready_prompt = ""

    def __init__(
        self,
        app_module: str,
        celery_args: Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        command_prefix: Sequence[str] = (),
        python_module: str = "celery",
        ready_timeout: float = 60.0,
    ) -> None:
        super().__init__(name)
        self.app_module = app_module
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="pikku-node-")) / f"{self.id[:12]}.log"
        argv = [
            *command_prefix,
            sys.executable,
            "-m",
            python_module,
            "-A",
            app_module,
            *celery_args,
        ]
        self.process = LocalProcess(argv, {**os.environ, **(env or {})}, log_path, cwd)
        self.ready_timeout = ready_timeout

    @property
    def log_path(self) -> Path:
        """The file the process's output goes to."""
        return self.process.log_path

    @property
    def pid(self) -> int | None:
        """The process group's id (its leader's pid), None before a start."""
        return self.process.pid

    @property
    def status(self) -> str:
        if self.process.proc is None:
            return "created"
        return "running" if self.process.running else "exited"

    def start(self) -> LocalProcessContainer:
        """Start the celery process."""
        self.process.start()
        return self

    def ready(self, timeout: float | None = None) -> bool:
        if self.process.proc is None:
            self.start()
        self.process.wait_for_output(
            self.ready_prompt, self.ready_timeout if timeout is None else timeout, self.name
        )
        return True

    def logs(self) -> str:
        """The celery process's output so far."""
        return self.process.logs()

    def kill(self, signal: Signal = "SIGKILL") -> None:
        """Send ``signal`` to the process group; after SIGKILL, reap it."""
        number = signal_number(signal)
        self.process.send(number)
        if number == signals.SIGKILL:
            self.process.wait(10)
            self._after_exit()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown), then SIGKILL after ``timeout`` seconds."""
        self.process.stop(timeout)
        self._after_exit()

    def restart(self, timeout: float = 60) -> None:
        """Stop (warm, up to ``timeout``), start again and wait until ready."""
        self.stop(timeout)
        self.start()
        self.ready(timeout)

    def teardown(self) -> None:
        self.kill("SIGKILL")

    def _after_exit(self) -> None:
        """Clean up after the process ended (a hook)."""

    @property
    def celeryconfig(self) -> dict[str, Any]:
        return {"app": self.app_module, "name": self.name}


class LocalWorkerContainer(LocalProcessContainer):
    """``celery -A app_module worker``: prefork (or ``pool``), ``queues``, INFO log.

    Gossip, mingle and heartbeats are off: they only slow a test worker's
    start. ``extra_args`` go last (``["-B"]``, ``["--max-tasks-per-child",
    "1"]``...).
    """

    ready_prompt = WORKER_READY

    def __init__(
        self,
        app_module: str,
        *,
        queues: Sequence[str] = (DEFAULT_QUEUE,),
        worker_name: str = DEFAULT_WORKER_NAME,
        concurrency: int = 1,
        pool: str = "prefork",
        log_level: str = "INFO",
        extra_args: Sequence[str] = (),
        **options: Any,
    ) -> None:
        if not queues:
            raise ValueError("a worker needs at least one queue")
        self._worker_name = worker_name
        self._queues = list(queues)
        self._log_level = log_level
        self.concurrency = concurrency
        self.pool = pool
        self.extra_args = list(extra_args)
        super().__init__(app_module, [], **options)
        self.name = f"{worker_name}@{self.id[:12]}"
        self.process.argv += [
            "worker",
            "--pool",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            ",".join(self._queues),
            "-n",
            self.name,
            "--loglevel",
            log_level,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            *self.extra_args,
        ]

    @property
    def hostname(self) -> str:
        """The worker's node name, as ``celery inspect`` and the logs show it."""
        return self.name

    @property
    def queues(self) -> list[str]:
        """The queues the worker consumes."""
        return list(self._queues)

    def version(self) -> str:
        """The Celery version the worker runs: this interpreter's."""
        return str(celery.__version__)

    def log_level(self) -> str:
        """The worker's log level, as pytest-celery's worker node reports it."""
        return self._log_level

    def worker_name(self) -> str:
        """The node name's part before the ``@``."""
        return self._worker_name

    def worker_queue(self) -> str:
        """The worker's first queue (pytest-celery's nodes know of one)."""
        return self._queues[0]

    @property
    def celeryconfig(self) -> dict[str, Any]:
        return {"app": self.app_module, "hostname": self.name, "queues": self.queues}


class LocalBeatContainer(LocalProcessContainer):
    """``celery -A app_module beat``, its schedule file beside its log."""

    ready_prompt = BEAT_READY

    def __init__(self, app_module: str, *, log_level: str = "INFO", **options: Any) -> None:
        super().__init__(app_module, [], **options)
        schedule = self.log_path.with_name(f"{self.log_path.stem}-schedule")
        self.process.argv += ["beat", "--loglevel", log_level, "-s", str(schedule)]
