"""What counting renewals on the attempt row costs a lease renewal, same server, same run.

    python benchmarks/renewal.py [--n 2000] [--backends postgres,mariadb]

On a scratch database (see ``benchmarks/store.py``), one step claimed with a
long lease is renewed over and over, interleaved round by round:

- ``UPDATE``: the yardstick of ``benchmarks/store.py`` (one autocommit
  single-row ``UPDATE`` by primary key);
- ``renew step row``: the renewal as it was before its count was kept: the
  fenced ``UPDATE`` of the step row alone (the store's ``renew`` statement);
- ``renew + count``: ``refresh_step_lease`` as it is, one statement writing
  the step row and counting on the attempt row (PostgreSQL: a data-modifying
  CTE; MariaDB: a two-table ``UPDATE``).

Prints each one's mean and median and its cost in UPDATE equivalents.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.store import SERVERS, TASK, row, scratch, steps, update_op
from pikku_celery.engine.passes import take_pass
from pikku_celery.sql.engines import make_engine
from pikku_celery.store import Decision, NewRun
from pikku_celery.store.migrate import upgrade
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.store.sql_for import store_for

LEASE_MS = 3_600_000


def renewal_ops(store: SQLWorkflowStore) -> tuple[Callable[[], None], Callable[[], None]]:
    """(step row only, renewal as the store does it) on one claimed step."""
    run, _ = store.create_run(NewRun("bench", {}))
    made = Decision(new_steps=steps(1))
    take_pass(store, run.id, None, lambda view: made)
    [step] = store.get_steps(run.id)
    claimed = store.claim_step(step.id, TASK, "bench-worker", LEASE_MS)
    assert claimed is not None
    params = {
        "p_id": claimed.id,
        "p_attempt": claimed.attempt,
        "p_lease_ms": LEASE_MS,
        "p_claim": claimed.claim_id,
    }
    single = make_engine(str(store.engine.url), isolation_level="AUTOCOMMIT")

    def step_row_only() -> None:
        with single.connect() as conn:
            assert conn.execute(store.statements.renew, params).rowcount == 1

    def counted() -> None:
        assert store.refresh_step_lease(claimed.id, claimed.attempt, LEASE_MS, claimed.claim_id)

    return step_row_only, counted


def measure(url: str, n: int, warmup: int = 200) -> dict[str, list[float]]:
    update, update_engine = update_op(url)
    engine = make_engine(url)
    store = store_for(engine)
    step_row_only, counted = renewal_ops(store)
    ops = [("UPDATE", update), ("renew step row", step_row_only), ("renew + count", counted)]
    times: dict[str, list[float]] = {name: [] for name, _ in ops}
    for i in range(n + warmup):
        for name, op in ops:
            t0 = time.perf_counter()
            op()
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    engine.dispose()
    update_engine.dispose()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="rounds (one of each operation)")
    parser.add_argument("--backends", default="postgres,mariadb")
    args = parser.parse_args()
    lines = [
        f"n = {args.n} rounds, operations interleaved; one thread; loopback",
        "",
        "| server   | operation      |    ops/s | mean ms | median ms | UPDATEs |",
        "|----------|----------------|----------|---------|-----------|---------|",
    ]
    for name in args.backends.split(","):
        with scratch(SERVERS[name]) as url:
            upgrade(url)
            times = measure(url, args.n)
        update_mean = statistics.fmean(times["UPDATE"])
        for op, xs in times.items():
            lines.append(row(name, op, xs, update_mean))
        print(f"{name}: done", file=sys.stderr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
