"""The long form of the schedule checks (``PIKKU_LONG=1``): real ``celery beat``
processes, a real worker, a Redis broker and PostgreSQL.

Two beats run ``every=5s`` for 60 s: exactly one run per tick. Both stop for
30 s; one restarts and, with ``catch_up=2``, starts the 2 ticks missed just
before the newest one (and the newest), none of the older ones.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pikku_celery.sql.engines import now_ms_expr
from pikku_celery.sql.schema import run_table
from pikku_celery.store import migrate
from tests.celery.workers import beat, worker
from tests.helpers import long_form
from tests.services import (
    PG_ADMIN_URL,
    SESSION_TAG,
    reachable_redis,
    scratch_database,
)

from .schedule_flows import WORKFLOW

pytestmark = [
    pytest.mark.slow,
    long_form("the 60 s two-beat and 30 s outage form of the schedule checks"),
]

BROKER_REDIS_DB = 13
EVERY_MS = 5000


def created(engine: sa.Engine) -> dict[int, list[int]]:
    """Each tick's runs' creation times (epoch ms), by tick."""
    query = sa.select(run_table.c.idempotency_key, run_table.c.created_at).where(
        run_table.c.workflow == WORKFLOW
    )
    found: dict[int, list[int]] = {}
    with engine.connect() as conn:
        for key, at in conn.execute(query):
            iso = key.split(":", 2)[2].replace("Z", "+00:00")  # schedule:NAME:TICK
            found.setdefault(round(datetime.fromisoformat(iso).timestamp() * 1000), []).append(at)
    return found


def ticks(engine: sa.Engine) -> Counter[int]:
    return Counter({tick: len(at) for tick, at in created(engine).items()})


def db_now(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(now_ms_expr("postgresql"))).scalar_one())


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    url, client = reachable_redis(BROKER_REDIS_DB)
    prefix = f"{SESSION_TAG}-beats"
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_longbeats") as db:
        migrate.upgrade(db)
        yield {
            **os.environ,
            "PIKKU_T_BROKER": url,
            "PIKKU_T_DATABASE": db.replace("postgresql://", "postgresql+psycopg://", 1),
            "PIKKU_T_QUEUE": prefix,
            "PIKKU_T_VISIBILITY": "30",
            "PIKKU_T_MARKS": str(tmp_path),
            "PIKKU_T_EXTRA": "tests.schedule.schedule_flows",
            "PIKKU_T_EVERY": str(EVERY_MS / 1000),
            "PIKKU_T_CATCH_UP": "2",
        }
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


def test_two_real_beats_for_60s_then_30s_down_and_catch_up(
    env: dict[str, str], tmp_path: Path
) -> None:
    engine = sa.create_engine(env["PIKKU_T_DATABASE"], poolclass=sa.pool.NullPool)
    queues = [f"{env['PIKKU_T_QUEUE']}-celery", f"{env['PIKKU_T_QUEUE']}-shipping"]
    nodes = [worker(env, queues, tmp_path / "worker.log", f"w-{SESSION_TAG}").wait_ready()]
    try:
        beats = [beat(env, tmp_path / f"beat{i}") for i in range(2)]
        nodes += beats
        wait_for(lambda: ticks(engine), 60, "the first scheduled run")
        first = db_now(engine)
        wait_for(lambda: db_now(engine) >= first + 60_000, 90, "60 s of two beats")
        for b in beats:
            b.stop()
        two_beats = ticks(engine)
        assert set(two_beats.values()) == {1}, two_beats  # one run per tick, never two
        seen = sorted(two_beats)
        assert seen == list(range(seen[0], seen[-1] + 1, EVERY_MS)), "a tick was missed"
        assert len(seen) >= 60_000 // EVERY_MS
        print(f"two beats: {len(seen)} ticks, one run each, none missed")

        last = seen[-1]
        wait_for(lambda: db_now(engine) >= last + 30_000, 60, "30 s without a beat")
        restart_at = db_now(engine)
        nodes.append(beat(env, tmp_path / "beat-again"))
        wait_for(lambda: max(ticks(engine)) > last + 30_000, 60, "the restarted beat's pass")
    finally:
        for node in nodes:
            node.stop()
    runs = created(engine)
    assert all(len(at) == 1 for at in runs.values())
    # The restarted beat's first pass: the runs created together, first after the restart.
    first_at = min(at[0] for at in runs.values() if at[0] > restart_at)
    first_pass = sorted(t for t, at in runs.items() if first_at <= at[0] <= first_at + 2000)
    assert first_pass == list(range(first_pass[0], first_pass[-1] + 1, EVERY_MS))
    # Beat was down: every tick but the newest was missed, catch_up=2 of them start.
    missed = first_pass[:-1]
    assert len(missed) == 2, (first_pass, first_at)  # catch_up=2
    assert first_pass[0] - last > 2 * EVERY_MS  # so older missed ticks existed...
    assert not [t for t in runs if last < t < first_pass[0]]  # ...and were dropped
    dropped = (first_pass[0] - last) // EVERY_MS - 1
    print(f"after 30 s down: {len(first_pass)} runs in the first pass, {len(missed)} missed")
    print(f"ticks caught up, {dropped} dropped")
    engine.dispose()
