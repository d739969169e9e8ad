"""A real prefork worker on the SQLite broker and the SQLite store keeps serving
while its pool processes are SIGKILLed, idle or busy.

An idle pool process is the dangerous one: in a pool whose processes share
one job pipe, it waits for work holding the pipe's lock, and dies holding it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from pikku_celery.engine.handle import RunHandle
from pikku_celery.sql.schema import metadata
from tests.broker.pool_extras import CHAIN, SLOW, busy_pids, chain_output
from tests.celery import realapp
from tests.celery.workers import CeleryProcess, WorkerProcess, beat, worker
from tests.helpers import wait_until

CONCURRENCY = 2
ROUNDS = 4  # each round: one busy kill, then every idle process killed
BATCH = 6  # short workflows started at the top of each round
VISIBILITY = 4.0
SERVE_WITHIN = 30.0  # a fresh run completes this soon after the kills
ALL_DONE_WITHIN = 120.0

pytestmark = pytest.mark.slow


@dataclass
class Cluster:
    env: dict[str, str]
    app: realapp.TestApp
    workdir: Path
    worker: WorkerProcess
    beat: CeleryProcess
    killed: dict[str, list[int]] = field(default_factory=lambda: {"idle": [], "busy": []})

    def pool(self) -> set[int]:
        """Pids of the worker's live pool processes (its main process's children)."""
        assert self.worker.pid is not None
        try:
            children = psutil.Process(self.worker.pid).children()
        except psutil.NoSuchProcess:
            raise AssertionError(f"the worker itself died\n{self.logs()}") from None
        return {c.pid for c in children if _alive(c)}

    def busy(self) -> set[int]:
        return self.pool() & busy_pids(self.workdir)

    def idle(self) -> set[int]:
        return self.pool() - busy_pids(self.workdir)

    def kill(self, kind: str, pids: set[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.killed[kind].append(pid)

    def logs(self) -> str:
        return (
            f"--- worker\n{self.worker.log()[-6000:]}\n--- beat\n{self.beat.log()[-1500:]}\n"
            f"killed: {self.killed}"
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    env = {
        "PIKKU_T_BROKER": f"sqlite-queue:///{tmp_path / 'broker.db'}",
        "PIKKU_T_DATABASE": f"sqlite:///{tmp_path / 'store.db'}",
        "PIKKU_T_QUEUE": "killed-pool",
        "PIKKU_T_VISIBILITY": str(VISIBILITY),
        "PIKKU_T_SWEEP": "1",
        "PIKKU_T_MARKS": str(tmp_path),
        "PIKKU_T_EXTRA": "tests.broker.pool_extras",
    }
    app = realapp.build(env)
    engine = app.pikku.sql_engine
    assert engine is not None
    metadata.create_all(engine)
    processes: list[CeleryProcess] = []
    try:
        processes.append(beat(env, tmp_path))
        node = worker(env, app.queues, tmp_path / "worker.log", "killed-pool", CONCURRENCY)
        processes.append(node)
        node.wait_ready()
        yield Cluster(env, app, tmp_path, node, processes[0])
    finally:
        for process in processes:
            process.kill()
        engine.dispose()


def serves(cluster: Cluster, i: int) -> None:
    """A fresh run completes within the bound: the worker is not frozen."""
    run = cluster.app.pikku.start(CHAIN, i)
    try:
        assert run.wait(timeout=SERVE_WITHIN) == chain_output(i)
    except Exception as exc:
        raise AssertionError(
            f"run {i} did not complete within {SERVE_WITHIN} s after the kills "
            f"({exc!r}); pool {cluster.pool()}\n{cluster.logs()}"
        ) from None


def test_a_worker_keeps_serving_while_its_idle_and_busy_pool_processes_are_killed(
    cluster: Cluster,
) -> None:
    pikku = cluster.app.pikku
    serves(cluster, 0)
    runs: list[tuple[RunHandle[Any], Any]] = []
    for r in range(ROUNDS):
        for b in range(BATCH):
            i = 100 * (r + 1) + b
            runs.append((pikku.start(CHAIN, i), chain_output(i)))
        key = f"slow-{r}"
        runs.append((pikku.start(SLOW, {"key": key, "seconds": 1.5}), key))

        # A busy process first, mid-task...
        cluster.kill("busy", {min(wait_until(cluster.busy, timeout=30))})
        # ...then every process waiting for work, under the same load.
        wait_until(lambda: len(cluster.pool()) == CONCURRENCY, timeout=30)
        cluster.kill("idle", wait_until(cluster.idle, timeout=30))
        serves(cluster, 1000 + r)

    for run, expected in runs:
        try:
            assert run.wait(timeout=ALL_DONE_WITHIN) == expected
        except Exception as exc:
            raise AssertionError(f"{run.run_id}: {exc!r}\n{cluster.logs()}") from None
    assert len(cluster.killed["busy"]) == ROUNDS
    assert len(cluster.killed["idle"]) >= ROUNDS

    # And a quiet worker, every process idle, killed one at a time.
    for k in range(2 * CONCURRENCY):
        wait_until(lambda: len(cluster.pool()) == CONCURRENCY, timeout=30)
        cluster.kill("idle", {min(wait_until(cluster.idle, timeout=30))})
        serves(cluster, 2000 + k)
    wait_until(lambda: len(cluster.pool()) == CONCURRENCY, timeout=30)  # made whole again


def _alive(process: psutil.Process) -> bool:
    """Running, not a zombie; a child that exits between the listing and
    this look is not alive either."""
    try:
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
