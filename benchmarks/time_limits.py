"""What a step's time limit costs the hot path: the same eager run with and without it.

    python benchmarks/time_limits.py [--steps 20] [--rounds 30] [--database-url URL]

An N-step workflow whose steps run eagerly (each one where the one before it
finished, the hot path), once with ``ctx.step(..., timeout=60)`` on every
step (each attempt armed on the watch thread, :mod:`pikku_celery.engine.interrupt`,
and disarmed when its body returns) and once without, interleaved round by
round on one engine (in-memory store by default, where the watch's share is
largest; ``--database-url`` for a SQL store). Beside them, the watch alone:
``WATCHER.run(limits, fn)`` against ``fn()`` for a body that returns at once.

Each pair's ratio (limited / plain) is taken within one round, so a slow
minute that hits both cancels out; the table shows the median and quartiles.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pikku_celery.engine import Context
from pikku_celery.engine.interrupt import WATCHER, TimeLimits
from pikku_celery.store import InMemoryWorkflowStore, WorkflowStore
from pikku_celery.testing import InlineDispatcher, make_engine


def make_store(url: str | None) -> WorkflowStore:
    if url is None:
        return InMemoryWorkflowStore()
    from pikku_celery.sql.engines import make_engine as make_sql_engine
    from pikku_celery.sql.schema import metadata
    from pikku_celery.store.sql_for import store_for

    engine = make_sql_engine(url)
    metadata.create_all(engine)
    return store_for(engine)


def runners(steps: int, url: str | None) -> dict[str, Callable[[], None]]:
    engine, dispatcher = make_engine(make_store(url), InlineDispatcher(eager=True))

    @dispatcher.task
    def inc(x: int) -> int:
        return x + 1

    @engine.workflow(name="bench.plain")
    def plain(ctx: Context) -> int:
        x = 0
        for i in range(steps):
            x = ctx.step(f"s{i}", inc, x)
        return x

    @engine.workflow(name="bench.limited")
    def limited(ctx: Context) -> int:
        x = 0
        for i in range(steps):
            x = ctx.step(f"s{i}", inc, x, timeout=60)
        return x

    def run(wf: Any) -> Callable[[], None]:
        def once() -> None:
            handle = wf.start()
            dispatcher.run_until_idle()
            assert handle.wait(timeout=30) == steps

        return once

    return {"plain": run(plain), "limited": run(limited)}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def watch_alone(n: int) -> tuple[list[float], list[float]]:
    """Per-call seconds of ``fn()`` and ``WATCHER.run(limits, fn)``, interleaved in blocks."""
    limits = TimeLimits(hard=60.0)

    def fn() -> int:
        return 1

    bare: list[float] = []
    watched: list[float] = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        bare.append((time.perf_counter() - t0) / n)
        t0 = time.perf_counter()
        for _ in range(n):
            WATCHER.run(limits, fn)
        watched.append((time.perf_counter() - t0) / n)
    return bare, watched


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--database-url", default=None)
    args = p.parse_args()

    run = runners(args.steps, args.database_url)
    for _ in range(3):  # warm-up
        run["plain"]()
        run["limited"]()
    per_step: dict[str, list[float]] = {"plain": [], "limited": []}
    ratios: list[float] = []
    for i in range(args.rounds):
        order = ["plain", "limited"] if i % 2 == 0 else ["limited", "plain"]
        took: dict[str, float] = {}
        for name in order:
            t0 = time.perf_counter()
            run[name]()
            took[name] = (time.perf_counter() - t0) / args.steps
            per_step[name].append(took[name])
        ratios.append(took["limited"] / took["plain"])

    store = args.database_url or "in-memory store"
    print(f"{args.steps}-step eager run, {args.rounds} rounds, {store}")
    print(f"{'':34} {'q1':>9} {'median':>9} {'q3':>9}")
    for name, label in (
        ("plain", "ms/step, no limit"),
        ("limited", "ms/step, timeout=60 per step"),
    ):
        q1, med, q3 = quartiles(per_step[name])
        print(f"{label:34} {q1 * 1000:9.3f} {med * 1000:9.3f} {q3 * 1000:9.3f}")
    q1, med, q3 = quartiles(ratios)
    print(f"{'ratio limited / plain (paired)':34} {q1:9.3f} {med:9.3f} {q3:9.3f}")
    bare, watched = watch_alone(20_000)
    print()
    print(f"{'the watch alone':34} {'q1':>9} {'median':>9} {'q3':>9}")
    for label, values in (("us/call, fn()", bare), ("us/call, WATCHER.run(fn)", watched)):
        q1, med, q3 = quartiles(values)
        print(f"{label:34} {q1 * 1e6:9.2f} {med * 1e6:9.2f} {q3 * 1e6:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
