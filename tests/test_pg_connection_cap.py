"""The session's cap on connections to the shared PostgreSQL fails a session that breaks it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg_connection_cap import ACTIVE_ENV, CAP_ENV

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sqlalchemy as sa
from tests.helpers import wait_until
from tests.pg_connection_cap import current_peak
from tests.services import PG_ADMIN_URL


def test_holds_four_connections():
    engine = sa.create_engine(PG_ADMIN_URL, pool_size=4, max_overflow=0)
    held = [engine.connect() for _ in range(4)]
    try:
        wait_until(lambda: current_peak().connections >= 4, timeout=20)
    finally:
        for conn in held:
            conn.close()
        engine.dispose()
"""


def _session(tmp_path: Path, cap: int) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_holder.py").write_text(HOLDER)
    # A session of its own: its own sampler and its own application_name, so
    # the outer session's connections (a busy suite's workers) are not counted.
    env = {k: v for k, v in os.environ.items() if k not in (ACTIVE_ENV, "PGAPPNAME")}
    env[CAP_ENV] = str(cap)
    env["PYTHONPATH"] = str(ROOT)
    plugin = ["-p", "tests.pg_connection_cap", "--rootdir", str(tmp_path)]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugin, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def shared_postgres(postgres_url: str) -> None:
    """The shared server reachable (else skip, or fail in CI)."""


def test_a_session_over_the_cap_fails_naming_its_test(
    shared_postgres: None, tmp_path: Path
) -> None:
    done = _session(tmp_path, cap=3)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed" in done.stdout  # the test itself passed: the cap failed the session
    assert "shared PostgreSQL connection cap exceeded" in done.stdout
    assert "(cap 3, PIKKU_TEST_PG_MAX_CONNECTIONS)" in done.stdout
    assert "during test_holder.py::test_holds_four_connections" in done.stdout


def test_a_session_within_the_cap_passes_and_says_its_peak(
    shared_postgres: None, tmp_path: Path
) -> None:
    done = _session(tmp_path, cap=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "connection cap exceeded" not in done.stdout
    assert "held at most" in done.stdout and "(cap 30," in done.stdout


def test_a_cap_that_is_not_a_number_is_refused(shared_postgres: None, tmp_path: Path) -> None:
    (tmp_path / "test_holder.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != ACTIVE_ENV}
    env.update({CAP_ENV: "thirty", "PYTHONPATH": str(ROOT)})
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.pg_connection_cap", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "PIKKU_TEST_PG_MAX_CONNECTIONS must be a whole number" in done.stderr
