"""Real `celery worker` and `celery beat` subprocesses for the tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]


class CeleryProcess:
    """One celery process group (a worker with its pool, or beat) and its log,
    of the app module ``app_module`` (``celery -A``)."""

    app_module = "tests.celery.realapp"

    def __init__(self, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.argv = argv
        self.env = {**os.environ, **env}
        self.log_path = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CeleryProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", self.app_module, *self.argv],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill it whole
        )
        log.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> CeleryProcess:
        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"celery exited early:\n{self.log()[-3000:]}")
            return "ready." in self.log() or "beat: Starting" in self.log()

        wait_until(ready, timeout=timeout, interval=0.1)
        return self

    def kill(self) -> None:
        """SIGKILL the whole process group: the worker and its pool."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


def worker_argv(queues: list[str], name: str, concurrency: int = 1) -> list[str]:
    """``celery worker`` arguments: prefork, ``queues``, node ``name``, INFO log."""
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


def worker(
    env: Mapping[str, str],
    queues: list[str],
    log: Path,
    name: str,
    concurrency: int = 1,
) -> CeleryProcess:
    return CeleryProcess(worker_argv(queues, name, concurrency), env, log).start()


def beat(env: Mapping[str, str], workdir: Path) -> CeleryProcess:
    return CeleryProcess(beat_argv(workdir), env, workdir / "beat.log").start()
