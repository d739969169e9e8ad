"""On pytest-xdist workers (scripts/test: ``-n 2``) the run is still one session
to the shared PostgreSQL: its workers' connections count together against
the cap, and its report names the tests running at the peak."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg_connection_cap import ACTIVE_ENV, CAP_ENV

ROOT = Path(__file__).resolve().parents[1]

# Both modules hold two connections at once: the right one until the left
# one is done; the left one until the controller's sampler (application_name:
# the run's) has counted after it saw all four held.
HOLDER = """
from pathlib import Path

import sqlalchemy as sa
from tests.helpers import wait_until
from tests.services import PG_ADMIN_URL, SESSION_TAG, SUITE_APP_NAME

RUN = SUITE_APP_NAME.rsplit("_", 1)[0]


def scalar(conn, sql, **params):
    value = conn.execute(sa.text(sql), params).scalar()
    conn.rollback()  # pg_stat_activity is read once per transaction
    return value


def test_holds_two_connections_beside_the_other_worker():
    assert SESSION_TAG == SUITE_APP_NAME and SUITE_APP_NAME.startswith(RUN + "_gw")
    engine = sa.create_engine(PG_ADMIN_URL, pool_size=2, max_overflow=0)
    held = [engine.connect() for _ in range(2)]
    try:
        if __name__ == "test_right":
            Path("right.holding").touch()
            wait_until(Path("left.done").exists, timeout=60, interval=0.05)
            return
        wait_until(Path("right.holding").exists, timeout=60, interval=0.05)
        workers = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE :w"
        assert scalar(held[0], workers, w=RUN + "_gw%") >= 4
        seen = scalar(held[0], "SELECT clock_timestamp()")
        sampled = "SELECT max(query_start) > :t FROM pg_stat_activity WHERE application_name = :a"
        wait_until(lambda: scalar(held[0], sampled, t=seen, a=RUN), timeout=60, interval=0.05)
        Path("left.done").touch()
    finally:
        for conn in held:
            conn.close()
        engine.dispose()
"""


def _run(tmp_path: Path, cap: int) -> subprocess.CompletedProcess[str]:
    for name in ("test_left.py", "test_right.py"):
        (tmp_path / name).write_text(HOLDER)
    # A run of its own: not this session's (nor this worker's) name or sampler.
    inherited = (ACTIVE_ENV, "PGAPPNAME", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")
    env = {k: v for k, v in os.environ.items() if k not in inherited}
    env.update({CAP_ENV: str(cap), "PYTHONPATH": str(ROOT)})
    plugins = ["-p", "tests.pg_connection_cap", "-p", "tests.parallel"]
    xdist = ["-n", "2", "--dist", "loadgroup", "--rootdir", str(tmp_path)]
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *plugins,
            *xdist,
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def shared_postgres(postgres_url: str) -> None:
    """The shared server reachable (else skip, or fail in CI)."""


def test_two_workers_over_the_cap_together_fail_the_run_naming_both_tests(
    shared_postgres: None, tmp_path: Path
) -> None:
    done = _run(tmp_path, cap=3)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout  # the tests passed: the cap failed the run
    assert "shared PostgreSQL connection cap exceeded" in done.stdout
    for name in ("test_left.py", "test_right.py"):
        assert f"{name}::test_holds_two_connections_beside_the_other_worker" in done.stdout


def test_two_workers_within_the_cap_pass(shared_postgres: None, tmp_path: Path) -> None:
    done = _run(tmp_path, cap=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "connection cap exceeded" not in done.stdout
    assert "held at most" in done.stdout and "(cap 30," in done.stdout
