"""The chaos suite, short form (CI), and its clock-skew run.

Each run: 40 five-step workflows, 3 real workers and beat, a worker SIGKILLed
(or frozen past its lease) every ~3 s, one flush of the broker and one crash
of the run's own throwaway PostgreSQL; then every run must end with each
step's ledger row and result written exactly once, by its final attempt. The long form is
``python -m tests.reliability.chaos --runs 200 --minutes 10``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from pikku_celery.sql.schema import metadata
from pikku_celery.testing.nodes import LocalRedisContainer
from tests.celery.workers import CeleryProcess
from tests.helpers import long_form, wait_until
from tests.services import PG_ADMIN_URL, REDIS_URL, SESSION_TAG, scratch_database, unavailable

from . import chaosapp
from .chaos import (
    CLOCK_TOLERANCE,
    ROOT,
    SKEW_ENV,
    SKEW_SECONDS,
    ChaosConfig,
    ChaosSummary,
    chaos_beat,
    chaos_env,
    chaos_worker,
    run_chaos,
    skewed,
)
from .chaosapp import STEPS

RUNS = 40


def _require(tool: str, path: str | None = None) -> None:
    if shutil.which(tool) is None or (path is not None and not Path(path).exists()):
        unavailable(tool, FileNotFoundError(f"{tool} is not installed"))


@pytest.fixture
def chaos_services(redis_client: redis.Redis) -> Iterator[None]:
    """Redis reachable, and PostgreSQL's server binaries there: the run crashes
    a throwaway PostgreSQL of its own, never the shared one."""
    _require("initdb")
    yield


def _short(skew: bool) -> ChaosSummary:
    return run_chaos(
        ChaosConfig(runs=RUNS, seconds=40.0, kill_every=3.0, skew_worker=skew, seed=None),
        echo=lambda line: print(line, flush=True),
    )


def _assert_held(s: ChaosSummary) -> None:
    # run_chaos raises on any violation; these restate the headline invariants.
    assert s.violations == []
    assert s.completed == RUNS
    assert s.steps == RUNS * STEPS and s.ledger_rows == RUNS * STEPS
    assert s.executions >= s.steps and s.reexecutions == s.executions - s.steps
    assert s.flushed_broker and s.restarted_postgres
    assert s.kills + s.pauses >= 5, "the killer hardly ran"


@pytest.mark.slow
@pytest.mark.timeout(240)
@long_form(
    "the run with the skewed worker below keeps the same invariants "
    "with one worker's clock an hour fast, and runs by default"
)
def test_the_short_chaos_run_keeps_every_invariant(chaos_services: None) -> None:
    summary = _short(skew=False)
    _assert_held(summary)
    assert summary.skewed_processes == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_chaos_run_with_a_worker_an_hour_fast_keeps_every_invariant(
    chaos_services: None,
) -> None:
    _require("faketime")
    summary = _short(skew=True)
    _assert_held(summary)
    # The skewed worker's pool processes really saw the fast clock ...
    assert summary.skew_seconds is not None
    assert abs(summary.skew_seconds - SKEW_SECONDS) <= CLOCK_TOLERANCE
    # ... and took part: it claimed attempts and committed steps (ledger
    # rows whose worker clock was an hour ahead of the database's).
    assert summary.skewed_attempts > 0
    assert summary.skewed_ledger_rows > 0


PROBE = """
import json, threading, time
from tests.reliability.launch import install_sleep_shim
install_sleep_shim()
began = time.monotonic()
time.sleep(0.1)
threading.Event().wait(0.1)
print(json.dumps({"clock": time.time(), "waited": time.monotonic() - began}))
"""


def test_faketime_gives_a_python_process_an_hour_fast_clock_whose_waits_work() -> None:
    """What the skewed worker runs under: its wall clock is an hour fast, and
    sleeps and timed waits still end on time (see tests.reliability.launch)."""
    _require("faketime")
    env = {**SKEW_ENV, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        skewed([sys.executable, "-c", PROBE]),
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    probe = json.loads(out.stdout)
    assert abs(probe["clock"] - time.time() - SKEW_SECONDS) < 60
    assert 0.2 <= probe["waited"] < 5


class SweepsDiscarded(AssertionError):
    """The runs never ended because the worker dropped the sweeps it was sent."""


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("skew", [False, True], ids=["on-time", "an-hour-fast"])
def test_a_lone_worker_recovers_lost_messages_through_the_sweep(
    skew: bool, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Messages lost before any worker ran: only the beat sweep can send them
    again, so the invariant "every run ends while a worker and beat run" holds
    only if the worker runs the sweeps it is sent, whatever its clock says.

    A regression test: the sweep's beat entry once carried ``expires`` (an
    absolute time on beat's clock), and a worker an hour fast discarded every
    sweep as expired; these runs then never ended."""
    if skew:
        _require("faketime")
    tag = f"{SESSION_TAG}_lone{int(skew)}"
    broker_node = LocalRedisContainer(REDIS_URL.rsplit("/", 1)[0] + "/11")
    with scratch_database(PG_ADMIN_URL, tag) as url:
        setup = sa.create_engine(url, poolclass=sa.pool.NullPool)
        metadata.create_all(setup)
        chaosapp.ledger.create(setup)
        setup.dispose()
        env = chaos_env(tag, url, broker_node)
        app = chaosapp.build(env)
        broker = redis.Redis.from_url(broker_node.url)
        procs: list[CeleryProcess] = []
        try:
            runs = [app.workflow.start(i) for i in range(3)]
            # their first steps' messages: lost
            assert broker.delete(f"{broker_node.prefix}{app.queue}") == 1
            procs.append(chaos_beat(env, tmp_path))
            procs.append(chaos_worker(env, app.queue, tmp_path / "w.log", f"lone-{tag}", 2, skew))
            for proc in procs:
                proc.wait_ready(timeout=60)
            try:
                wait_until(
                    lambda: all(r.status() == "completed" for r in runs), timeout=20, interval=0.1
                )
            except AssertionError:
                dropped = procs[1].log().count("Discarding revoked task: pikku.sweep")
                if dropped:
                    raise SweepsDiscarded(
                        f"runs {[str(r.status()) for r in runs]} after 20 s: the worker "
                        f"discarded {dropped} sweep messages as expired (does the sweep's "
                        "beat entry carry an expiry, judged on the worker's clock?)"
                    ) from None
                raise
        finally:
            for proc in procs:
                proc.teardown()  # SIGKILL (and faketime's leftovers removed)
            broker_node.teardown()
            for key in redis_client.scan_iter(match=f"{tag}:*"):
                redis_client.delete(key)
            assert app.pikku.sql_engine is not None
            app.pikku.sql_engine.dispose()
