"""One local process group with its output in a log file.

Each process runs in a session of its own, so a signal sent to it reaches the
whole group (a prefork worker's pool included), as ``docker kill`` reaches
every process of a container.
"""

from __future__ import annotations

import contextlib
import os
import signal as signals
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

Signal = str | int


def signal_number(sig: Signal) -> int:
    """``"SIGKILL"``, ``"KILL"``, ``9`` or ``signal.SIGKILL`` as a number."""
    if isinstance(sig, int):
        return int(sig)
    name = sig.upper()
    if not name.startswith("SIG"):
        name = f"SIG{name}"
    try:
        return int(signals.Signals[name])
    except KeyError:
        raise ValueError(f"unknown signal {sig!r}") from None


class LocalProcess:
    """``argv`` started in ``cwd`` with ``env``, its stdout and stderr appended to ``log_path``.

    :meth:`start` may be called again after the process ended (a restart);
    :meth:`output_since_start` is the log written since the latest start, so a
    readiness check never mistakes the previous run's banner for this one's.
    """

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self.starts = 0

    @property
    def pid(self) -> int | None:
        """The process's id (its group's too) while it has been started."""
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        """Whether the process group's leader is alive."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The leader's exit code once it ended, else None."""
        return self.proc.poll() if self.proc is not None else None

    def start(self) -> LocalProcess:
        """Start the process in a session of its own, its output appended to the log."""
        if self.running:
            raise RuntimeError(f"{self.argv[0]} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: a signal reaches it whole
            )
        self.starts += 1
        return self

    def logs(self) -> str:
        """Everything the process wrote, over all its starts."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def output_since_start(self) -> str:
        """The log from the latest start on (a restart's banner, not the last run's)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def send(self, sig: Signal) -> None:
        """Send ``sig`` to the whole process group; nothing if it is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal_number(sig))

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the group and reap the process."""
        self.send(signals.SIGKILL)
        self.wait(timeout)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (a warm shutdown for a worker), then SIGKILL after ``timeout``."""
        if not self.running:
            return
        self.send(signals.SIGTERM)
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the leader to exit; its exit code (None on timeout)."""
        if self.proc is None:
            return None
        return self.proc.wait(timeout)

    def wait_for_output(self, text: str, timeout: float, what: str = "") -> None:
        """Return once ``text`` is in the output since the latest start.

        Raises :class:`TimeoutError` after ``timeout`` seconds and
        :class:`RuntimeError` at once if the process exits first; both carry
        the log's tail.
        """
        deadline = time.monotonic() + timeout
        while True:
            if text in self.output_since_start():
                return
            if not self.running:
                raise RuntimeError(
                    f"{what or self.argv[0]} exited ({self.returncode}) before logging "
                    f"{text!r}:\n{self.logs()[-3000:]}"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{what or self.argv[0]} did not log {text!r} within {timeout} s:\n"
                    f"{self.logs()[-3000:]}"
                )
            time.sleep(0.05)  # polling the log file, with a deadline
