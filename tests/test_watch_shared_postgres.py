"""scripts/watch-shared-postgres, pointed at a throwaway server that a test restarts."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.throwaway import ThrowawayPostgres

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "watch-shared-postgres"
TAG = "pikku_twatchtest0"


def _read_until(proc: subprocess.Popen[str], wanted: str) -> list[str]:
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:  # the test's timeout bounds the wait
        seen.append(line)
        if wanted in line:
            return seen
    raise AssertionError(f"{wanted!r} never printed: {''.join(seen)}")


@pytest.mark.timeout(120)
def test_the_watcher_counts_a_restart_and_a_session_s_connections(
    throwaway_pg: ThrowawayPostgres,
) -> None:
    url = sa.engine.make_url(throwaway_pg.url).set(drivername="postgresql")
    engine = sa.create_engine(
        throwaway_pg.url, poolclass=sa.pool.NullPool, connect_args={"application_name": TAG}
    )
    held = [engine.connect() for _ in range(3)]
    watch = [str(SCRIPT), "--url", url.render_as_string(False), "--verbose"]
    proc = subprocess.Popen(
        [sys.executable, *watch],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _read_until(proc, f"new peak: 3 connections of {TAG}")
        for conn in held:
            conn.close()
        throwaway_pg.restart("immediate")
        _read_until(proc, "the server restarted")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        engine.dispose()
    assert proc.returncode == 1  # a restart fails the watch
    assert f"test sessions' peaks: {TAG} 3" in out
    assert "restarts: 1, peak connections: 3 (all clients)" in out
