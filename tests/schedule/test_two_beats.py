"""Beats racing for real: exactly one run per tick, and catch-up after a beat's death.

Short form (the default run): beats are processes running the schedules'
pass (:mod:`.driver`) on PostgreSQL, ``every=1s``: two of them on one
schedule for a few seconds, and a third, on another schedule with
``catch_up=2``, SIGKILLed, left dead for a few ticks and started again.
The long form (``PIKKU_LONG=1``, :mod:`.test_long_beats`) runs real
``celery beat`` processes at ``every=5s`` for 60 s and 30 s down.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import now_ms_expr
from pikku_celery.sql.schema import run_table
from pikku_celery.store import migrate
from tests.services import PG_ADMIN_URL, SESSION_TAG, scratch_database

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_beats") as url:
        migrate.upgrade(url)
        yield url


class Beat:
    """A driver process; its JSON lines read once it ended."""

    def __init__(self, url: str, name: str, catch_up: int, log: Path, not_before: int = 0) -> None:
        self.log = log
        self.out = log.open("w")
        argv = [sys.executable, "-m", "tests.schedule.driver", url, name, "1", str(catch_up)]
        self.proc = subprocess.Popen(
            [*argv, "0.2", str(not_before)], stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.out.close()

    def passes(self) -> list[dict[str, Any]]:
        lines = [json.loads(x) for x in self.log.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if "started" in x]


def ticks(engine: sa.Engine, workflow: str) -> Counter[str]:
    """How many runs each tick's idempotency key has."""
    with engine.connect() as conn:
        keys = conn.execute(
            sa.select(run_table.c.idempotency_key).where(run_table.c.workflow == workflow)
        ).scalars()
        return Counter(k.split(":", 2)[2] for k in keys)  # schedule:NAME:TICK


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def tick_ms(iso: str) -> int:
    return round(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def db_now(engine: sa.Engine) -> int:
    """The database's clock (the one ticks are judged on), epoch ms."""
    with engine.connect() as conn:
        return int(conn.execute(sa.select(now_ms_expr("postgresql"))).scalar_one())


@pytest.mark.slow
def test_two_beats_start_one_run_per_tick_and_a_restarted_beat_catches_up(
    pg_url: str, tmp_path: Path
) -> None:
    engine = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    beats = [Beat(pg_url, "race", 0, tmp_path / f"race-{i}.log") for i in range(2)]
    lone = Beat(pg_url, "lone", 2, tmp_path / "lone-1.log")
    restarted: Beat | None = None
    try:
        # The lone beat runs a few ticks, dies by SIGKILL, and no pass runs
        # for 4 ticks: its successor starts at once, its first pass held back.
        wait_for(lambda: ticks(engine, "scheduled-lone"), 30, "the lone beat's first run")
        lone.kill()
        killed_at = max(map(tick_ms, ticks(engine, "scheduled-lone")))
        restarted = Beat(pg_url, "lone", 2, tmp_path / "lone-2.log", killed_at + 4100)
        wait_for(lambda: bool(restarted_passes(restarted)), 30, "the restarted beat's pass")
        # The racing beats have run side by side meanwhile; which one wins a
        # tick is the luck of their phases, so wait until each has won one.
        wait_for(lambda: len(ticks(engine, "scheduled-race")) >= 4, 30, "the racing beats' runs")
        wait_for(lambda: all(started_ticks(b) for b in beats), 30, "a tick won by each beat")
    finally:
        for beat in [*beats, lone, restarted]:
            if beat is not None:
                beat.kill()
    race = ticks(engine, "scheduled-race")
    assert set(race.values()) == {1}, race  # never two runs of a tick
    starts = sorted(map(tick_ms, race))
    assert starts == list(range(starts[0], starts[-1] + 1, 1000)), "a tick was missed"
    # Both beats took part, and ticks both started were deduplicated, not doubled.
    by_beat = [started_ticks(b) for b in beats]
    reported = by_beat[0] | by_beat[1]
    assert reported <= set(starts)
    # Only the newest tick's run may go unreported: a beat killed mid-pass.
    assert set(starts) - reported <= {starts[-1]}

    assert restarted is not None
    first = restarted_passes(restarted)[0]
    caught = [t for _, t, _ in first["started"]]
    assert len(caught) == 3  # the 2 missed ticks before the newest, and the newest
    assert caught == list(range(caught[0], caught[0] + 3000, 1000))
    assert caught[0] > killed_at + 1000, "the ticks right after the kill are dropped"
    [(_, dropped)] = first["dropped"]
    assert dropped == (caught[0] - killed_at) // 1000 - 1
    lone_runs = ticks(engine, "scheduled-lone")
    assert set(lone_runs.values()) == {1}
    engine.dispose()


def started_ticks(beat: Beat) -> set[int]:
    """The ticks ``beat`` reported starting (or finding started)."""
    return {t for p in beat.passes() for _, t, _ in p["started"]}


def restarted_passes(beat: Beat) -> list[dict[str, Any]]:
    return beat.passes() if beat.log.exists() else []
