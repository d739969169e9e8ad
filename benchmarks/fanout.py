"""Wide fan-out: what one branch of a ``gather`` costs at 10 and at 1,000 branches.

    python benchmarks/fanout.py [--store postgres|memory] [--rounds 5]

Four runs, each timed from ``start`` to its output, in a scratch PostgreSQL
database (``PIKKU_TEST_PG_URL`` as the admin URL) or the in-memory store: a
``gather`` of 10 and of 1,000 task steps, and of 10 and 100 child runs (each
child one step). The engine runs in this process on the inline dispatcher
(no broker, no worker process: the broker's share is the same per message
whatever the width, and ``benchmarks/workflow.py`` measures it), so a row is
the engine's and the store's cost. Each round times every shape once, in
turn; a row gives the median per branch, and beside it the engine's share
(time inside the passes' replays and resumes, per branch) and the number of
passes. The last column is the per-branch cost over the narrow form's,
paired by round: a branch must cost the same however many there are.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pikku_celery.engine import Context, WorkflowEngine, choose
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from pikku_celery.testing import InlineDispatcher, make_engine

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
SHAPES = [("steps", 10), ("steps", 1000), ("children", 10), ("children", 100)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", choices=["postgres", "memory"], default="postgres")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with scratch_store(args.store) as store:
        engine, inline = make_engine(store, InlineDispatcher(), max_steps_per_run=1000)
        shapes = workflows(engine, inline)
        engine_time = timed_replays()
        times: dict[tuple[str, int], list[tuple[float, float, int]]] = {s: [] for s in SHAPES}
        for i in range(args.rounds + 1):  # the first round warms up
            for shape in SHAPES:
                engine_time.reset()
                t0 = time.perf_counter()
                run = shapes[shape[0]].start(shape[1])
                inline.run_until_idle(timeout=600)
                assert run.wait(timeout=60) == shape[1]
                wall = time.perf_counter() - t0
                if i:
                    times[shape].append((wall, engine_time.seconds, engine_time.passes))
            print(f"\r  round {i}/{args.rounds}", end="", file=sys.stderr)
        print(file=sys.stderr)
    report(args, times)
    return 0


def workflows(engine: WorkflowEngine, inline: InlineDispatcher) -> dict[str, Any]:
    @inline.task
    def one() -> int:
        return 1

    @engine.workflow(name="fan.leaf")
    def leaf(ctx: Context) -> int:
        return int(ctx.step("one", one))

    @engine.workflow(name="fan.steps")
    def steps(ctx: Context, n: int) -> int:
        return sum(ctx.gather(*[ctx.step_async(f"s{i}", one) for i in range(n)]))

    @engine.workflow(name="fan.children")
    def children(ctx: Context, n: int) -> int:
        return sum(ctx.gather(*[ctx.child_async(f"c{i}", leaf) for i in range(n)]))

    return {"steps": steps, "children": children}


class _Replays:
    """Time spent deciding passes (replay or resume), and how many."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.passes = 0

    def reset(self) -> None:
        self.seconds, self.passes = 0.0, 0


def timed_replays() -> _Replays:
    seen = _Replays()
    decide: Callable[..., Any] = choose.replay

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return decide(*args, **kwargs)
        finally:
            seen.seconds += time.perf_counter() - t0
            seen.passes += 1

    setattr(choose, "replay", timed)  # noqa: B010 - the name the passes call
    return seen


@contextmanager
def scratch_store(kind: str) -> Iterator[WorkflowStore]:
    if kind == "memory":
        yield InMemoryWorkflowStore()
        return
    from pikku_celery.sql.engines import make_engine as make_sql_engine
    from pikku_celery.store import migrate
    from pikku_celery.store.sql_for import store_for

    tag = f"pikku_fanout_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {tag}")
    url = sa.engine.make_url(PG_ADMIN).set(database=tag).render_as_string(hide_password=False)
    engine = None
    try:
        migrate.upgrade(url)
        engine = make_sql_engine(url)
        store = store_for(engine)
        yield store
        store.close()
    finally:
        if engine is not None:
            engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {tag} WITH (FORCE)")


def report(args: argparse.Namespace, times: dict[tuple[str, int], list[Any]]) -> None:
    print(f"\nfan-out, {args.store} store, inline dispatcher, median of {args.rounds} rounds\n")
    print(
        "| gather of        | per branch ms | engine per branch ms | passes | "
        "per branch / narrow form (by round) |"
    )
    print("|------------------|---------------|----------------------|--------|---|")
    for kind, n in SHAPES:
        rows = times[(kind, n)]
        narrow = times[(kind, 10)]
        per = statistics.median(w / n for w, _, _ in rows) * 1000
        engine = statistics.median(e / n for _, e, _ in rows) * 1000
        passes = statistics.median(p for _, _, p in rows)
        pairs = zip(rows, narrow, strict=True)
        ratios = sorted((w / n) / (w10 / 10) for (w, _, _), (w10, _, _) in pairs)
        growth = f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f} to {ratios[-1]:.2f})"
        print(f"| {n:>5} {kind:<10} | {per:>13.3f} | {engine:>20.3f} | {passes:>6.0f} | {growth} |")


if __name__ == "__main__":
    sys.exit(main())
