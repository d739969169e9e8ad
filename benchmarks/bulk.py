"""Bulk retry rate on PostgreSQL: runs retried per second by a filter.

    python benchmarks/bulk.py [--runs 2000] [--repeats 3] [--jobs 4] [--broker redis://127.0.0.1:6379/12]

Makes ``--runs`` failed runs (a workflow whose body raises) in a scratch
PostgreSQL database (``PIKKU_TEST_PG_URL`` as the admin URL), then times
what ``pikku-celery runs retry --workflow W`` does: pick the failed runs,
and retry each (read, reopen, audit, wake-up message through Celery on
``--broker``). Beside it, in the same run and on the same broker, plain
Celery's floor for the same count: ``apply_async`` of one message per run
(what re-sending the work costs without any bookkeeping). Each measurement
of pikku is taken with one run at a time and with ``--jobs`` at once, the
runs failed again (one pass each) before each. Prints every measurement,
then the median, min and max of each rate and its ratio to Celery's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from celery import Celery

from pikku_celery import Context, Pikku, RunStatus
from pikku_celery.engine.bulk import BulkAction, RunFilter, act_on_runs, pick_runs
from pikku_celery.model.values import Operator
from pikku_celery.store.migrate import upgrade

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WORKFLOW = "bench.broken"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--jobs", type=int, default=4, help="runs acted on at once (and 1)")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.services import scratch_database

    queue = f"pikku-bench-bulk-{uuid.uuid4().hex[:8]}"
    with scratch_database(PG_ADMIN, f"pikku_bench_bulk_{os.getpid()}") as url:
        upgrade(url)
        app = Celery("bulk-bench", broker=args.broker, set_as_current=False)
        app.conf.task_default_queue = queue
        pikku = Pikku(app, url, install_beat=False)

        @pikku.workflow(name=WORKFLOW)
        def broken(ctx: Context, n: int) -> None:
            raise ValueError(f"run {n} fails [on purpose]")

        @app.task(name="bench.noop", shared=False)
        def noop(n: int) -> None: ...

        began = time.perf_counter()
        ids = [pikku.start(WORKFLOW, n).run_id for n in range(args.runs)]
        print(f"made {len(ids)} failed runs in {time.perf_counter() - began:.1f} s")
        jobs = sorted({1, args.jobs})
        rows: dict[str, list[float]] = {f"pikku --jobs {j}": [] for j in jobs}
        rows["celery apply_async"] = []

        def fail_again() -> None:  # one pass each: the body raises again
            for run_id in ids:
                pikku.orchestrate(run_id, "bench")

        print(f"{'repeat':>6} {'what':>20} {'pick s':>7} {'act s':>7} {'per s':>7}")
        for repeat in range(1, args.repeats + 1):
            for j in jobs:
                if repeat > 1 or j != jobs[0]:
                    fail_again()
                t0 = time.perf_counter()
                picked = pick_runs(pikku, BulkAction.RETRY, RunFilter(workflow=WORKFLOW))
                t1 = time.perf_counter()
                done = act_on_runs(pikku, BulkAction.RETRY, picked, Operator("bench"), workers=j)
                t2 = time.perf_counter()
                assert len(done.done) == args.runs, (len(picked), len(done.refused))
                rate = args.runs / (t2 - t0)
                rows[f"pikku --jobs {j}"].append(rate)
                what = f"pikku --jobs {j}"
                print(f"{repeat:>6} {what:>20} {t1 - t0:>7.2f} {t2 - t1:>7.2f} {rate:>7.0f}")
            with app.producer_or_acquire() as producer:
                t3 = time.perf_counter()
                for n in range(args.runs):
                    noop.apply_async((n,), producer=producer)
                t4 = time.perf_counter()
            rate = args.runs / (t4 - t3)
            rows["celery apply_async"].append(rate)
            print(f"{repeat:>6} {'celery apply_async':>20} {'-':>7} {t4 - t3:>7.2f} {rate:>7.0f}")
        print("\nper second, median (min..max) over the repeats:")
        celery = statistics.median(rows["celery apply_async"])
        for what, values in rows.items():
            median = statistics.median(values)
            print(
                f"{what:>20}: {median:7.0f} ({min(values):.0f}..{max(values):.0f})"
                f"  celery/this {celery / median:.1f}x"
            )
        statuses = {r.status for r in pikku.store.list_runs(workflow=WORKFLOW, limit=10)}
        assert statuses == {RunStatus.RUNNING}
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        pikku.close()


if __name__ == "__main__":
    main()
