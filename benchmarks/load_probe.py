"""Load probe: many short workflows through one worker, beside plain Celery chains.

    python benchmarks/load_probe.py [--runs 2000] [--threads 4] [--backends postgres,mariadb]

For each store (a scratch database on each server, migrated here and dropped
afterwards) one ``celery worker --pool solo`` on a Redis broker serves, in
turn, plain Celery (three-link chains of ``inc``, results in the Redis
backend) and pikku (a three-step workflow of the same task). Each is started
from T threads, each thread starting its share and then waiting for it
(``AsyncResult.get`` / ``RunHandle.wait``).

It checks what a load test is for, and exits 1 when either fails: every run
finished with the right output, and no step needed a second attempt. It
reports the worker's resident memory (read from /proc before and after each
phase, for a person to judge whether it grows with the runs), the worker
log's error and warning lines, the wall time, runs/s, steps/s and how long
starting took. The worker's log stays in /tmp; its path is printed.

Server URLs: ``PIKKU_TEST_PG_URL`` / ``PIKKU_TEST_MYSQL_URL`` (admin URLs: the
script creates and drops its own databases), ``PIKKU_LOAD_REDIS`` (broker and
result backend; the default uses a database of its own).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.loadapp import STEPS, LoadApp, build  # noqa: E402
from pikku_celery.store import migrate  # noqa: E402

SERVERS = {
    "postgres": os.environ.get(
        "PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
    ),
    "mariadb": os.environ.get("PIKKU_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"),
}
REDIS = os.environ.get("PIKKU_LOAD_REDIS", "redis://127.0.0.1:6379/13")
WARMUP = 20  # runs of each before the first memory reading


@dataclass
class Phase:
    store: str
    what: str
    runs: int
    start_s: float = 0.0
    wall_s: float = 0.0
    ok: int = 0
    problems: list[str] = field(default_factory=list)
    rss_start_kb: int = 0
    rss_end_kb: int = 0


@dataclass
class StoreCheck:
    store: str
    runs_by_status: dict[str, int]
    steps: int
    max_attempt: int
    steps_reattempted: int
    attempt_rows: int
    max_attempt_rows_per_step: int
    attempts_by_status: dict[str, int]
    worker_log: str
    log_problems: list[str]
    rss_peak_kb: int

    @property
    def clean(self) -> bool:
        return self.max_attempt <= 1 and self.max_attempt_rows_per_step <= 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=2000)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument(
        "--backends", default="postgres,mariadb", help="comma-separated: " + ",".join(SERVERS)
    )
    args = p.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in SERVERS]
    if unknown:
        p.error(f"unknown backend(s) {unknown}; choose from {list(SERVERS)}")

    phases: list[Phase] = []
    checks: list[StoreCheck] = []
    for store in backends:
        ph, check = probe(store, SERVERS[store], args.runs, args.threads)
        phases += ph
        checks.append(check)
    report(phases, checks, args.runs, args.threads)
    good = all(ph.ok == ph.runs for ph in phases) and all(c.clean for c in checks)
    return 0 if good else 1


def probe(store: str, admin_url: str, n: int, threads: int) -> tuple[list[Phase], StoreCheck]:
    """Both phases on one store's scratch database and one fresh solo worker."""
    tag = f"pikku_load_{uuid.uuid4().hex[:8]}"
    log_path = f"/tmp/{tag}-{store}-worker.log"
    with scratch(admin_url, tag) as db_url:
        print(f"[{store}] database {tag}, worker log {log_path}", file=sys.stderr)
        migrate.upgrade(db_url)
        load = build(REDIS, db_url, tag)
        engine = load.pikku.sql_engine
        assert engine is not None
        env = {
            **os.environ,
            "PIKKU_LOAD_BROKER": REDIS,
            "PIKKU_LOAD_DB": db_url,
            "PIKKU_LOAD_QUEUE": tag,
        }
        try:
            worker: subprocess.Popen[bytes] | None = None
            try:
                with open(log_path, "wb") as log:
                    worker = subprocess.Popen(
                        [sys.executable, "-m", "celery", "-A", "benchmarks.loadapp", "worker",
                         "--pool", "solo", "-Q", tag, "--without-gossip", "--without-mingle",
                         "--without-heartbeat", "--loglevel", "WARNING"],
                        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )  # fmt: skip
                phases = exercise(store, load, worker, n, threads)
                peak = rss_kb(worker.pid, "VmHWM")
            finally:
                if worker is not None:
                    stop(worker)
                forget_queue(tag)
                load.app.close()
            check = store_check(store, engine, log_path, peak)
        finally:
            engine.dispose()
    return phases, check


def exercise(
    store: str, load: LoadApp, worker: subprocess.Popen[bytes], n: int, threads: int
) -> list[Phase]:
    from celery import chain

    inc = load.inc

    def start_chain(i: int) -> Any:
        return chain(inc.s(i), *[inc.s() for _ in range(STEPS - 1)]).apply_async()

    def wait_chain(result: Any, timeout: float) -> Any:
        return result.get(timeout=timeout)

    def start_run(i: int) -> Any:
        return load.three.start(i)

    def wait_run(handle: Any, timeout: float) -> Any:
        return handle.wait(timeout=timeout)

    print(f"[{store}] warming up ({WARMUP} of each) ...", file=sys.stderr)
    for i in range(WARMUP):
        if wait_chain(start_chain(i), 60) != i + STEPS:
            raise RuntimeError("warm-up chain returned a wrong result")
        if wait_run(start_run(i), 60) != i + STEPS:
            raise RuntimeError("warm-up workflow returned a wrong result")
    if worker.poll() is not None:
        raise RuntimeError(f"the worker exited with {worker.returncode}")
    phases = []
    for what, start, wait in (
        ("Celery chain", start_chain, wait_chain),
        ("pikku workflow", start_run, wait_run),
    ):
        phase = Phase(store, what, n, rss_start_kb=rss_kb(worker.pid))
        drive(phase, threads, start, wait)
        phase.rss_end_kb = rss_kb(worker.pid)
        if worker.poll() is not None:
            phase.problems.append(f"the worker exited with {worker.returncode}")
        phases.append(phase)
    return phases


def drive(
    phase: Phase,
    threads: int,
    start: Callable[[int], Any],
    wait: Callable[[Any, float], Any],
) -> None:
    """Each of ``threads`` threads starts its share of the runs, then waits for them."""
    n = phase.runs
    deadline_s = 120.0 + 0.25 * n  # a stuck run shows as not finished, not as a hang
    lock = threading.Lock()
    counts = {"started": 0, "done": 0}
    started_at: list[float] = []
    barrier = threading.Barrier(threads + 1)
    t0 = 0.0

    def problem(text: str) -> None:
        with lock:
            phase.problems.append(text)

    def worker_thread(k: int) -> None:
        barrier.wait()
        mine: list[tuple[int, Any]] = []
        for i in range(k, n, threads):
            try:
                mine.append((i, start(i)))
            except Exception as exc:
                problem(f"run {i}: start raised {exc!r}")
            with lock:
                counts["started"] += 1
        with lock:
            started_at.append(time.perf_counter())
        for i, pending in mine:
            left = max(0.01, t0 + deadline_s - time.perf_counter())
            try:
                out = wait(pending, left)
            except Exception as exc:
                problem(f"run {i}: {type(exc).__name__}: {exc}")
            else:
                if out == i + STEPS:
                    with lock:
                        phase.ok += 1
                else:
                    problem(f"run {i}: output {out!r}, expected {i + STEPS}")
            with lock:
                counts["done"] += 1

    pool = [threading.Thread(target=worker_thread, args=(k,), daemon=True) for k in range(threads)]
    for t in pool:
        t.start()
    t0 = time.perf_counter()
    barrier.wait()
    label = f"[{phase.store}] {phase.what}"
    while any(t.is_alive() for t in pool):
        with lock:
            s, d = counts["started"], counts["done"]
        print(f"\r  {label}: started {s}/{n}, done {d}/{n}", end="", file=sys.stderr)
        for t in pool:
            t.join(0.5)
    phase.wall_s = time.perf_counter() - t0
    phase.start_s = max(started_at, default=t0) - t0
    print(
        f"\r  {label}: {phase.ok}/{n} ok in {phase.wall_s:.1f} s"
        f" (starting took {phase.start_s:.1f} s)   ",
        file=sys.stderr,
    )


def store_check(store: str, engine: sa.Engine, log_path: str, peak_kb: int) -> StoreCheck:
    """What the database says about every run of this store, warm-ups included."""
    with engine.connect() as conn:
        q = conn.exec_driver_sql
        runs = q("SELECT status, count(*) FROM pikku_workflow_run GROUP BY status").all()
        steps, max_attempt, again = q(
            "SELECT count(*), coalesce(max(attempt), 0),"
            " coalesce(sum(CASE WHEN attempt > 1 THEN 1 ELSE 0 END), 0)"
            " FROM pikku_workflow_step"
        ).one()
        rows, per_step = q(
            "SELECT coalesce(sum(n), 0), coalesce(max(n), 0) FROM"
            " (SELECT step_id, count(*) AS n FROM pikku_workflow_step_attempt"
            " GROUP BY step_id) AS t"
        ).one()
        by_status = q(
            "SELECT status, count(*) FROM pikku_workflow_step_attempt GROUP BY status"
        ).all()
    return StoreCheck(
        store,
        {str(k): int(v) for k, v in runs},
        int(steps),
        int(max_attempt),
        int(again),
        int(rows),
        int(per_step),
        {str(k): int(v) for k, v in by_status},
        log_path,
        log_problems(log_path),
        peak_kb,
    )


LOG_PROBLEM = re.compile(r"\b(ERROR|CRITICAL|Traceback)\b|WARNING/")


def log_problems(path: str) -> list[str]:
    """The worker log's error and warning lines (the worker logs at WARNING)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError as exc:
        return [f"cannot read the worker log: {exc}"]
    return [line for line in lines if LOG_PROBLEM.search(line)]


def rss_kb(pid: int, key: str = "VmRSS") -> int:
    """A /proc/<pid>/status memory figure in kB (0 when the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def stop(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown of the worker's process group; killed if it lingers."""
    try:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
    except ProcessLookupError:
        worker.wait(10)


def forget_queue(queue: str) -> None:
    """Drop the scratch queue's keys from the broker (empty unless a run was lost)."""
    try:
        r = redis.Redis.from_url(REDIS)
        keys = list(r.scan_iter(match=f"*{queue}*"))
        if keys:
            r.delete(*keys)
        r.close()
    except redis.RedisError as exc:
        print(f"could not clean queue {queue} from the broker: {exc}", file=sys.stderr)


@contextmanager
def scratch(admin_url: str, name: str) -> Iterator[str]:
    """A fresh database ``name`` on the server of ``admin_url``, dropped afterwards."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    url = sa.make_url(admin_url).set(database=name)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        force = " WITH (FORCE)" if url.get_backend_name() == "postgresql" else ""
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}{force}")
        admin.dispose()


def report(phases: list[Phase], checks: list[StoreCheck], n: int, threads: int) -> None:
    print(
        f"\n{n} runs of {STEPS} steps from {threads} threads, one `celery worker --pool solo`,"
        " Redis broker (and Celery's result backend)\n"
    )
    print(
        "| store | what | ok | start s | wall s | runs/s | steps/s | worker RSS MB before | after |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for ph in phases:
        print(
            f"| {ph.store} | {ph.what} | {ph.ok}/{ph.runs} | {ph.start_s:.1f} | {ph.wall_s:.1f}"
            f" | {ph.runs / ph.wall_s:.0f} | {ph.runs * STEPS / ph.wall_s:.0f}"
            f" | {ph.rss_start_kb / 1024:.1f} | {ph.rss_end_kb / 1024:.1f} |"
        )
    print("\nThe store afterwards (warm-up runs included)\n")
    print(
        "| store | runs by status | steps | max attempt | steps with attempt > 1"
        " | attempt rows | max rows per step | attempts by status | worker peak RSS MB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---|---:|")
    for c in checks:
        runs = ", ".join(f"{k} {v}" for k, v in sorted(c.runs_by_status.items()))
        attempts = ", ".join(f"{k} {v}" for k, v in sorted(c.attempts_by_status.items()))
        print(
            f"| {c.store} | {runs} | {c.steps} | {c.max_attempt} | {c.steps_reattempted}"
            f" | {c.attempt_rows} | {c.max_attempt_rows_per_step} | {attempts}"
            f" | {c.rss_peak_kb / 1024:.1f} |"
        )
    print()
    for ph in phases:
        if ph.ok != ph.runs:
            print(f"- {ph.store} {ph.what}: {ph.runs - ph.ok} runs did not finish right, e.g.:")
            for line in ph.problems[:5]:
                print(f"    {line}")
    for c in checks:
        if not c.clean:
            print(f"- {c.store}: some step took more than one attempt")
        found = f"{len(c.log_problems)} error/warning lines" if c.log_problems else "clean"
        print(f"- {c.store} worker log: {c.worker_log} ({found})")
        for line in c.log_problems[:5]:
            print(f"    {line}")


if __name__ == "__main__":
    sys.exit(main())
