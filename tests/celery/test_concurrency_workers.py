"""Concurrency per key on real workers: two ``celery worker`` nodes (prefork, two
processes each) and ``celery beat`` on Redis, the store on PostgreSQL.

Twenty starts race on one key with a limit of one, from threads and from two
processes; the attempts' own start and end times (the database's clock) show
that at no instant two of them ran, and they ran in the order the key took
them in. A gate run (waiting for a signal) holds the key while the starts
race, so that order can be read from the key before any of them runs.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from pikku_celery import Concurrency, RunStatus, WorkflowCancelledError
from pikku_celery.engine import RunHandle
from pikku_celery.model.slots import ConcurrencySlots
from pikku_celery.ports.store import StoreCapabilities
from pikku_celery.sql.schema import metadata
from tests.helpers import long_form, wait_until
from tests.services import (
    PG_ADMIN_URL,
    SESSION_TAG,
    reachable_redis,
    scratch_database,
)

from . import realapp
from .workers import CeleryProcess, beat, worker

pytestmark = pytest.mark.slow

BROKER_REDIS_DB = 13  # this module's own: its queues are deleted afterwards
VISIBILITY = 3.0
STARTS = 20
THREADS = 4  # starting threads per process
EXTRA = "tests.celery.concurrency_flows"


@dataclass
class Cluster:
    env: dict[str, str]
    workdir: Path
    app: realapp.TestApp
    workers: list[CeleryProcess] = field(default_factory=list)
    nodes: list[CeleryProcess] = field(default_factory=list)

    def add_worker(self) -> CeleryProcess:
        name = f"cc{len(self.workers)}-{SESSION_TAG}"
        node = worker(self.env, self.app.queues, self.workdir / f"{name}.log", name, 2)
        self.workers.append(node)
        self.nodes.append(node)
        return node

    def slots(self) -> ConcurrencySlots:
        slots = StoreCapabilities(self.app.pikku.store).slots
        assert slots is not None
        return slots

    def logs(self) -> str:
        return "\n".join(f"--- {n.log_path.name}\n{n.log()[-3000:]}" for n in self.nodes)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("concurrency")
    url, client = reachable_redis(BROKER_REDIS_DB)
    with scratch_database(PG_ADMIN_URL, f"{SESSION_TAG}_cc") as database:
        engine = sa.create_engine(database, poolclass=sa.pool.NullPool)
        metadata.create_all(engine)
        engine.dispose()
        env = {
            "PIKKU_T_BROKER": url,
            "PIKKU_T_DATABASE": database,
            "PIKKU_T_QUEUE": f"{SESSION_TAG}-cc",
            "PIKKU_T_VISIBILITY": str(VISIBILITY),
            "PIKKU_T_SWEEP": "1",
            "PIKKU_T_MARKS": str(workdir),
            "PIKKU_T_EXTRA": EXTRA,
        }
        app = realapp.build(env)
        c = Cluster(env, workdir, app)
        try:
            c.nodes.append(beat(env, workdir))
            for _ in range(2):
                c.add_worker()
            for node in c.workers:
                node.wait_ready()
            yield c
        finally:
            for node in c.nodes:
                node.kill()
            for q in app.queues:
                for key in client.scan_iter(f"{q}*"):
                    client.delete(key)
            assert app.pikku.sql_engine is not None
            app.pikku.sql_engine.dispose()


def stored_key(workflow: str, key: str) -> str:
    return Concurrency(key=str).key_for(workflow, key)


def start_together(wf: Any, job: dict[str, Any], count: int, threads: int) -> list[str]:
    """Start ``count`` runs of ``job`` from ``threads`` threads released at
    once (few threads: each holds a connection of the shared server); their ids."""
    barrier = threading.Barrier(threads)
    ids: list[str] = []
    errors: list[BaseException] = []

    def share(n: int) -> None:
        barrier.wait()
        try:
            for _ in range(n):
                ids.append(wf.start(job).run_id)
        except BaseException as exc:
            errors.append(exc)

    shares = [count // threads + (i < count % threads) for i in range(threads)]
    started = [threading.Thread(target=share, args=(n,)) for n in shares]
    for t in started:
        t.start()
    for t in started:
        t.join(60)
    assert not errors, errors
    return ids


def start_in_process(
    env: dict[str, str], workflow: str, job: dict[str, Any], count: int, barrier: Any, out: Any
) -> None:
    """One process's share of the starts (its own app, engine and pool)."""
    built = realapp.build(env)
    wf = built.pikku.registry.get(workflow)
    barrier.wait()
    for run_id in start_together(wf, job, count, THREADS):
        out.put(run_id)
    assert built.pikku.sql_engine is not None
    built.pikku.sql_engine.dispose()


def handles(cluster: Cluster, ids: list[str]) -> list[RunHandle[Any]]:
    return [cluster.app.pikku.handle(i) for i in ids]


def work_spans(runs: list[RunHandle[Any]]) -> list[tuple[int, int, str]]:
    """Each run's "work" attempts as (started, finished, run id), by start."""
    spans = []
    for run in runs:
        for step in run.steps():
            if step.step.name == "work":
                for a in step.attempts:
                    assert a.finished_at is not None
                    spans.append((a.started_at, a.finished_at, run.run_id))
    return sorted(spans)


def assert_one_at_a_time_in_order(runs: list[RunHandle[Any]], order: list[str]) -> None:
    spans = work_spans(runs)
    for (_, end, _), (start, _, _) in itertools.pairwise(spans):
        assert end <= start, spans  # never two at once
    assert [rid for _, _, rid in spans] == order


def open_gate(cluster: Cluster, workflow: str, key: str) -> RunHandle[Any]:
    """A run that holds ``key`` until it is sent "go": the starts queue behind it."""
    gate = cluster.app.pikku.registry.get(workflow).start(
        {"key": key, "seconds": 0.02, "gate": True}
    )
    assert gate.status() == RunStatus.RUNNING
    return gate


def key_order(
    cluster: Cluster, workflow: str, key: str, gate: RunHandle[Any], ids: list[str]
) -> list[str]:
    """The order ``key`` took the racing starts ``ids`` in (all waiting behind ``gate``)."""
    on_key = [s.run_id for s in cluster.slots().slots_of(stored_key(workflow, key))]
    assert on_key[0] == gate.run_id and sorted(on_key[1:]) == sorted(ids)
    assert all(cluster.app.pikku.handle(i).status() == RunStatus.QUEUED for i in ids)
    return on_key


def race_from_processes(
    cluster: Cluster, workflow: str, job: dict[str, Any], count: int
) -> list[str]:
    """``count`` starts of ``job`` from two processes released together; their ids."""
    forked = multiprocessing.get_context("fork")  # no re-import: only the starts cost
    barrier, out = forked.Barrier(2), forked.Queue()
    procs = [
        forked.Process(
            target=start_in_process, args=(cluster.env, workflow, job, count // 2, barrier, out)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    ids = [out.get(timeout=120) for _ in range(count // 2 * 2)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return ids


def wait_all(cluster: Cluster, runs: list[RunHandle[Any]]) -> None:
    try:
        for run in runs:
            run.wait(timeout=120)
    except Exception:
        print(cluster.logs())
        raise


def test_twenty_racing_starts_on_a_key_run_one_at_a_time_in_start_order(
    cluster: Cluster,
) -> None:
    """Twenty starts from threads on one key, twenty from two processes on
    another; both keys' runs then run side by side on the workers."""
    wf = cluster.app.pikku.registry.get("cc.queue")
    gates = {key: open_gate(cluster, "cc.queue", key) for key in ("threads", "processes")}
    job = {"key": "threads", "seconds": 0.02}
    by_threads = start_together(wf, job, STARTS, THREADS)
    by_processes = race_from_processes(
        cluster, "cc.queue", {"key": "processes", "seconds": 0.02}, STARTS
    )
    orders = {
        "threads": key_order(cluster, "cc.queue", "threads", gates["threads"], by_threads),
        "processes": key_order(cluster, "cc.queue", "processes", gates["processes"], by_processes),
    }
    for gate in gates.values():
        gate.signal("go")
    for order in orders.values():
        runs = handles(cluster, order)
        wait_all(cluster, runs)
        assert_one_at_a_time_in_order(runs, order)


@long_form("200 starts")
def test_two_hundred_racing_starts_on_a_limit_of_three_never_run_four_at_once(
    cluster: Cluster,
) -> None:
    wf = cluster.app.pikku.registry.get("cc.three")
    job = {"key": "long", "seconds": 0.3}  # long enough for three to overlap
    by_threads = start_together(wf, job, 100, THREADS)
    by_processes = race_from_processes(cluster, "cc.three", job, 100)
    runs = handles(cluster, by_threads + by_processes)
    began = time.monotonic()
    wait_all(cluster, runs)
    spans = work_spans(runs)
    events = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    running = most = 0
    for _, change in events:  # an end at the same millisecond as a start comes first
        running += change
        most = max(most, running)
    assert most <= 3, most  # never past the limit
    print(f"200 runs, limit 3: {time.monotonic() - began:.1f} s, at most {most} at once")


def test_cancel_in_progress_leaves_only_the_newest_completed(cluster: Cluster) -> None:
    key = "latest"
    wf = cluster.app.pikku.registry.get("cc.latest")
    first = wf.start({"key": key, "seconds": 0.02, "gate": True})  # running, waiting for "go"
    ids = start_together(wf, {"key": key, "seconds": 0.02}, STARTS, THREADS)
    on_key = cluster.slots().slots_of(stored_key("cc.latest", key))
    newest = on_key[-1].run_id  # the one the key took last; every other one ends
    assert newest in ids
    runs = handles(cluster, [first.run_id, *ids])
    for run in runs:
        with contextlib.suppress(WorkflowCancelledError):
            run.wait(timeout=60)
    statuses = {run.run_id: run.status() for run in runs}
    assert statuses.pop(newest) == RunStatus.COMPLETED
    assert set(statuses.values()) == {RunStatus.CANCELLED}


def test_a_worker_sigkilled_while_its_run_holds_the_key_frees_it_after_takeover(
    cluster: Cluster,
) -> None:
    key = "killed"
    wf = cluster.app.pikku.registry.get("cc.hang")
    (cluster.workdir / "next.pid").write_text("0")  # the second run's step returns at once
    victim = wf.start({"key": key, "mark": "victim"})
    second = wf.start({"key": key, "mark": "next"})
    assert second.status() == RunStatus.QUEUED
    mark = cluster.workdir / "victim.pid"
    wait_until(mark.exists, timeout=30)
    group = os.getpgid(int(mark.read_text()))
    (holder,) = [node for node in cluster.workers if node.pid == group]
    holder.kill()  # the whole worker node, main process and pool, SIGKILL
    killed = time.monotonic()
    try:
        assert second.wait(timeout=60) == "next"
    except Exception:
        print(cluster.logs())
        raise
    print(f"kill to the next run's completion: {time.monotonic() - killed:.2f} s")
    assert victim.status() == RunStatus.COMPLETED
    (hang,) = victim.steps()
    assert hang.step.attempt == 2  # taken over
    (after,) = second.steps()
    assert hang.attempts[-1].finished_at is not None
    assert hang.attempts[-1].finished_at <= after.attempts[0].started_at
