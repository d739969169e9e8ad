"""A pytest plugin: the session's connections to the shared PostgreSQL, capped.

The machine's PostgreSQL serves other developers too, and has only so many
connection slots. Every connection the suite opens carries the session's
``application_name`` (``PGAPPNAME``, set at conftest import, inherited by the
worker subprocesses). One thread, on one connection of its own, samples
``pg_stat_activity`` all session long and keeps the peak; a peak above the cap
(``PIKKU_TEST_PG_MAX_CONNECTIONS``) fails the session, naming the tests that
were running then.

Under pytest-xdist the controller samples and its workers do not: the cap is
the whole run's, every worker's connections counted together (a worker's
``application_name`` is the run's with its id added: tests/services.py).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field

import psycopg
import pytest
import sqlalchemy as sa

CAP_ENV = "PIKKU_TEST_PG_MAX_CONNECTIONS"
DEFAULT_CAP = 30
INTERVAL_SECONDS = 0.05
# Set by the outermost session's sampler: a pytest run inside a test leaves
# the counting to it (its connections carry the same application_name).
ACTIVE_ENV = "PIKKU_TEST_PG_SAMPLER"

COUNT = """
SELECT count(*), coalesce(string_agg(DISTINCT datname, ',' ORDER BY datname), '')
FROM pg_stat_activity
WHERE application_name ~ %(apps)s OR datname LIKE %(databases)s
"""


def cap(workers: int = 1) -> int:
    """The most connections the session may hold at once: by default
    :data:`DEFAULT_CAP` for each xdist worker of the run."""
    raw = os.environ.get(CAP_ENV, "")
    try:
        return int(raw) if raw else DEFAULT_CAP * workers
    except ValueError:
        raise pytest.UsageError(f"{CAP_ENV} must be a whole number, not {raw!r}") from None


@dataclass
class Peak:
    """The most connections seen at once, and when."""

    connections: int = 0
    during: str = "(no test yet)"
    databases: str = ""
    samples: int = 0


@dataclass
class Sampler:
    """Samples the session's connections until stopped; keeps the peak."""

    conninfo: str
    app: str
    databases: str
    current: str = "(collection)"
    running: dict[str, None] = field(default_factory=dict)  # in start order
    peak: Peak = field(default_factory=Peak)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
        self._thread = threading.Thread(
            target=self._loop, args=(conn,), name="pg-connection-cap", daemon=True
        )
        self._thread.start()

    def stop(self) -> Peak:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.peak

    def _loop(self, conn: psycopg.Connection[tuple[int, str]]) -> None:
        # The run's own name, and its xdist workers' (the name and _gw<n>).
        apps = f"^{re.escape(self.app)}(_gw[0-9]+)?$"
        params = {"apps": apps, "databases": f"{self.databases}%"}
        try:
            with conn:
                while not self._stop.is_set():
                    during = self.current
                    row = conn.execute(COUNT, params).fetchone()
                    if row is not None:
                        self.peak.samples += 1
                        if row[0] > self.peak.connections:
                            self.peak = Peak(row[0], during, row[1], self.peak.samples)
                    self._stop.wait(INTERVAL_SECONDS)
        except psycopg.Error as exc:
            # The count stops but the session goes on: the summary says so.
            self.error = f"{type(exc).__name__}: {exc}".strip()


_session: list[tuple[Sampler, int]] = []  # this process's outermost session's sampler


def current_peak() -> Peak | None:
    """The peak so far of this process's sampling session (None when not sampling)."""
    return _session[0][0].peak if _session else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start sampling (the outermost session only; not for --collect-only)."""
    from tests.services import PG_ADMIN_URL, SESSION_TAG, SUITE_APP_NAME

    if os.environ.get(ACTIVE_ENV) or session.config.getoption("collectonly"):
        return
    workers = getattr(session.config.option, "numprocesses", None)
    limit = cap(workers if isinstance(workers, int) and workers > 0 else 1)  # a bad value fails now
    url = sa.engine.make_url(PG_ADMIN_URL).set(drivername="postgresql")
    sampler = Sampler(url.render_as_string(hide_password=False), SUITE_APP_NAME, SESSION_TAG)
    try:
        sampler.start()
    except psycopg.Error as exc:
        sampler.error = f"not sampled: {exc}".strip()
    os.environ[ACTIVE_ENV] = "1"
    _session.append((sampler, limit))


def pytest_runtest_logstart(nodeid: str) -> None:
    """The tests whose setup, call or teardown run now (one per xdist worker)."""
    for sampler, _ in _session:
        sampler.running[nodeid] = None
        sampler.current = ", ".join(sampler.running)


def pytest_runtest_logfinish(nodeid: str) -> None:
    for sampler, _ in _session:
        sampler.running.pop(nodeid, None)
        sampler.current = ", ".join(sampler.running) or f"(after {nodeid})"


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _session:
        return
    sampler, limit = _session[0]
    peak = sampler.stop()
    os.environ.pop(ACTIVE_ENV, None)
    if peak.connections > limit and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _session:
        return
    sampler, limit = _session.pop()
    peak = sampler.peak
    line = (
        f"shared PostgreSQL: this session held at most {peak.connections} connections at once "
        f"(cap {limit}, {CAP_ENV}), during {peak.during}"
        + (f" (databases {peak.databases})" if peak.databases else "")
        + f"; {peak.samples} samples"
    )
    if sampler.error is not None:
        line += f"; sampling stopped early: {sampler.error}"
    if peak.connections > limit:
        terminalreporter.write_sep("=", "shared PostgreSQL connection cap exceeded", red=True)
        terminalreporter.write_line(f"FAILED {line}", red=True)
    else:
        terminalreporter.write_line(line)
