"""Retention at size on PostgreSQL: how fast batched prunes go, how long each holds its locks.

    python benchmarks/prune.py [--runs 100000] [--live 1000] [--steps 3]
        [--batch-sizes 100,500,2000]

For each batch size, in a scratch database it creates and drops
(``PIKKU_TEST_PG_URL`` as the admin URL): bulk-inserts ``--runs`` settled
runs (40 days old, ``--steps`` steps each with one attempt row, an audit row
on every tenth run) and ``--live`` running runs with a running step, straight
with SQL (``INSERT ... SELECT generate_series``, not the API), then prunes
everything settled over 30 days ago with the store's own batches while a
worker thread keeps writing to the live runs (a renewal and a run touch per
iteration, as workers do). Prints, per batch size: runs pruned per second,
each batch's transaction time (from its first read to its commit: the
longest any of its row locks can be held) p50/p99/max, the worker's write
latency before and during the prune (p50/p99/max), the most lock requests
seen waiting at once in ``pg_locks`` while it pruned (a worker queued behind a
prune's lock would show there), and that every live run survived. The last
line says whether batched deletes keep up with 1,000 settled runs a second.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa

from pikku_celery.engine.prune import prune_runs
from pikku_celery.sql.engines import make_engine
from pikku_celery.store.migrate import upgrade
from pikku_celery.store.prune import PruneBatch, PruneQuery
from pikku_celery.store.sql_for import store_for

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
DAY_MS = 86_400_000
KEEP_DAYS = 30

GENERATE = [
    # settled runs, 40 days old, one ms apart
    """INSERT INTO pikku_workflow_run (id, workflow, status, input, output, cancel_requested,
        version, sweep_count, depth, created_at, updated_at)
    SELECT gen_random_uuid()::text, 'bench.done', 'completed', '{}', '1', false, 3, 0, 0,
        :old + i, :old + i + 50
    FROM generate_series(1, :runs) AS i""",
    # live runs, created now
    """INSERT INTO pikku_workflow_run (id, workflow, status, input, cancel_requested,
        version, sweep_count, depth, created_at, updated_at)
    SELECT gen_random_uuid()::text, 'bench.live', 'running', '{}', false, 2, 0, 0, :now, :now
    FROM generate_series(1, :live) AS i""",
    # steps: succeeded for settled runs, running (a live lease) for live ones
    """INSERT INTO pikku_workflow_step (id, run_id, name, seq, kind, status, task_name, args,
        kwargs, attempt, max_attempts, retry_delay, backoff, lease_expires_at, result, worker,
        claim_id, next_sweep_at, sweep_count, created_at, updated_at)
    SELECT gen_random_uuid()::text, r.id, 's' || s, s, 'task',
        CASE WHEN r.status = 'running' THEN 'running' ELSE 'succeeded' END,
        'bench.work', '[]', '{}', 1, 3, 0, 1,
        CASE WHEN r.status = 'running' THEN :now + 3600000 END,
        CASE WHEN r.status = 'running' THEN NULL ELSE '1' END,
        'w', md5(r.id || s), 0, 0, r.created_at, r.updated_at
    FROM pikku_workflow_run r CROSS JOIN generate_series(0, :steps - 1) AS s""",
    """INSERT INTO pikku_workflow_step_attempt (step_id, attempt, run_id, status, worker, result,
        started_at, finished_at, claim_id, dispatch, renewals)
    SELECT s.id, 1, s.run_id, CASE WHEN s.status = 'running' THEN 'running' ELSE 'succeeded' END,
        'w', s.result, s.created_at, s.updated_at, s.claim_id, 'broker', 0
    FROM pikku_workflow_step s""",
    """INSERT INTO pikku_workflow_audit (run_id, action, actor, origin, details, at)
    SELECT id, 'signal', 'ops', 'bench', '{}', updated_at
    FROM pikku_workflow_run WHERE status = 'completed' AND random() < 0.1""",
]


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, nearest rank."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spread(values: list[float]) -> str:
    return f"{pct(values, 0.5):7.2f} {pct(values, 0.99):7.2f} {max(values, default=0):7.2f}"


class Worker(threading.Thread):
    """Writes to live runs as workers do (a step renewal, a run touch), timing each."""

    def __init__(self, engine: sa.Engine, live: list[tuple[str, str]]) -> None:
        super().__init__(daemon=True)
        self.engine, self.live = engine, live
        self.stop = threading.Event()
        self.phase = "before"
        self.timings: dict[str, list[float]] = {"before": [], "during": []}

    def run(self) -> None:
        renew = sa.text(
            "UPDATE pikku_workflow_step SET lease_expires_at = lease_expires_at + 1 WHERE id = :s"
        )
        touch = sa.text("UPDATE pikku_workflow_run SET version = version + 1 WHERE id = :r")
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                run_id, step_id = random.choice(self.live)
                began = time.perf_counter()
                with conn.begin():
                    conn.execute(renew, {"s": step_id})
                    conn.execute(touch, {"r": run_id})
                self.timings[self.phase].append((time.perf_counter() - began) * 1000)
                time.sleep(0.002)


class LockWatch(threading.Thread):
    """Samples ``pg_locks`` every few ms: the most lock requests seen waiting at once
    in the scratch database (a worker queued behind a prune's row lock shows here)."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(daemon=True)
        self.engine = engine
        self.stop = threading.Event()
        self.most = 0
        self.samples = 0

    def run(self) -> None:
        waiting = sa.text(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE NOT l.granted AND d.datname = current_database()"
        )
        with self.engine.connect() as conn:
            while not self.stop.is_set():
                self.most = max(self.most, int(conn.execute(waiting).scalar_one()))
                conn.rollback()
                self.samples += 1
                time.sleep(0.005)


def measure(url: str, runs: int, live: int, steps: int, batch_size: int) -> dict[str, object]:
    engine = make_engine(url, pool_size=4)
    with engine.begin() as conn:
        for table in ("audit", "step_attempt", "step", "run"):
            conn.exec_driver_sql(f"TRUNCATE pikku_workflow_{table} CASCADE")
        now = int(
            conn.exec_driver_sql("SELECT (extract(epoch from now()) * 1000)::bigint").scalar_one()
        )
        params = {"now": now, "old": now - 40 * DAY_MS, "runs": runs, "live": live, "steps": steps}
        began = time.perf_counter()
        for statement in GENERATE:
            conn.execute(sa.text(statement), params)
        generated = time.perf_counter() - began
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT r.id, s.id FROM pikku_workflow_run r JOIN pikku_workflow_step s "
            "ON s.run_id = r.id WHERE r.status = 'running'"
        ).all()
    worker = Worker(engine, [(str(r), str(s)) for r, s in rows])
    worker.start()
    time.sleep(1.0)  # the worker's writes with no prune running, for comparison
    worker.phase = "during"
    watch = LockWatch(engine)
    watch.start()
    store = store_for(engine)
    batches: list[PruneBatch] = []
    query = PruneQuery(cutoff_ms=store.now_ms() - KEEP_DAYS * DAY_MS, batch_size=batch_size)
    began = time.perf_counter()
    report = prune_runs(store, query, on_batch=batches.append)
    took = time.perf_counter() - began
    worker.stop.set()
    watch.stop.set()
    worker.join()
    watch.join()
    with engine.connect() as conn:
        left = conn.exec_driver_sql("SELECT status, count(*) FROM pikku_workflow_run GROUP BY 1")
        kept = dict(left.all())
        live_steps = conn.exec_driver_sql(
            "SELECT count(*) FROM pikku_workflow_step WHERE status = 'running'"
        ).scalar_one()
    engine.dispose()
    held = [b.held_ms for b in batches]
    return {
        "batch_size": batch_size,
        "generated_s": generated,
        "pruned": report.counts.runs,
        "rows": report.counts.runs
        + report.counts.steps
        + report.counts.attempts
        + report.counts.audit,
        "seconds": took,
        "runs_per_s": report.counts.runs / took if took else 0.0,
        "batches": len(batches),
        "held": held,
        "before": worker.timings["before"],
        "during": worker.timings["during"],
        "kept": kept,
        "lock_waits": watch.most,
        "lock_samples": watch.samples,
        "live_ok": kept == {"running": live} and live_steps == live * steps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--live", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-sizes", default="100,500,2000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    name = f"pikku_prune_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    url = sa.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    results = []
    try:
        upgrade(url)
        for size in sizes:
            print(f"batch size {size}: generating and pruning ...", file=sys.stderr, flush=True)
            results.append(measure(url, args.runs, args.live, args.steps, size))
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()
    print(
        f"prune on PostgreSQL: {args.runs} settled runs x {args.steps} steps (+ attempts, audit), "
        f"{args.live} live runs written to by a worker meanwhile; one run per batch size"
    )
    print(
        f"{'batch':>6} {'runs':>7} {'rows':>8} {'secs':>6} {'runs/s':>8} {'batches':>7} | "
        f"{'batch tx ms p50 p99 max':>23} | {'worker write ms before':>23} | "
        f"{'worker write ms during':>23} | live kept"
    )
    for r in results:
        held, before, during = r["held"], r["before"], r["during"]
        assert isinstance(held, list) and isinstance(before, list) and isinstance(during, list)
        print(
            f"{r['batch_size']:>6} {r['pruned']:>7} {r['rows']:>8} {r['seconds']:6.1f} "
            f"{r['runs_per_s']:8.0f} {r['batches']:>7} | {spread(held)} | {spread(before)} | "
            f"{spread(during)} | {'yes' if r['live_ok'] else 'NO: ' + str(r['kept'])}"
        )
    for r in results:
        held = r["held"]
        assert isinstance(held, list)
        print(
            f"batch size {r['batch_size']}: no lock held over {max(held, default=0):.0f} ms "
            f"(median batch {statistics.median(held) if held else 0:.1f} ms); "
            f"lock requests seen waiting at once: at most {r['lock_waits']} "
            f"({r['lock_samples']} samples of pg_locks)"
        )
    best = max(float(str(r["runs_per_s"])) for r in results)
    verdict = "keep up with" if best >= 1000 else "do NOT keep up with"
    print(f"batched deletes {verdict} 1,000 settled runs/s here (best {best:.0f} runs/s)")
    return 0 if all(r["live_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
