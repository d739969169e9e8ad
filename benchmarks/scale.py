"""The named statements at 10^4 and 10^6 runs: each one's time at each size, and the ratio.

    python benchmarks/scale.py [--runs 10000,1000000] [--steps-per-run 10] [--repeat 30] [--reuse]

Generates each size with :mod:`benchmarks.scale_data` (bulk SQL into a scratch
database ``pikku_scale_<runs>``; ``--reuse`` keeps them for the next call and
reuses what an earlier ``--reuse`` left), then, for every statement of
:data:`tests.scale_statements.CHECKED`, EXPLAINs it (a sequential scan of
a big table is marked) and runs it ``--repeat`` times bound to real ids
(writes each in a transaction rolled back, so every run sees the same data).
It prints one table: per statement, at each size, the server's execution time
(EXPLAIN ANALYZE: the database's work, no round trip) as a median with its
10th-90th percentile spread, the client's median beside it (round trip and
SQLAlchemy included), and each larger size's ratio of server medians to the
smallest's (the target is 2x at most). Sizes run side by side, each repetition
on every size in turn, so a noisy moment of a shared machine falls on all of
them; still, read a ratio with its spread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa

from benchmarks import scale_data
from pikku_celery.sql.engines import make_engine
from pikku_celery.store.sql_for import store_for
from tests.scale_statements import (
    CHECKED,
    bind,
    explain,
    sample,
    server_ms,
    whole_table_reads,
)

TARGET_RATIO = 2.0


@dataclass(frozen=True)
class Timing:
    """One statement at one size: the server's milliseconds (median, p10, p90),
    the client's median (with the round trip and SQLAlchemy), and what its plan
    reads whole."""

    median: float
    p10: float
    p90: float
    client: float
    seq_scans: tuple[str, ...]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(urls: dict[int, str], repeat: int) -> dict[int, dict[str, Timing]]:
    """Every checked statement's plan and time at each size.

    Side by side: each repetition runs the statement once on every size in
    turn, so a noisy moment of a shared machine falls on all sizes alike."""
    engines = {n: make_engine(url) for n, url in urls.items()}
    conns = {n: e.connect() for n, e in engines.items()}
    found: dict[int, dict[str, Timing]] = {n: {} for n in urls}
    try:
        named = store_for(next(iter(engines.values()))).statements.named()
        data = {}
        for n, conn in conns.items():
            data[n] = sample(conn)
            conn.rollback()
        for checked in CHECKED:
            stmt = named[checked.name]
            params = {n: {**bind(stmt, checked.name, data[n]), **checked.params} for n in urls}
            scans = {}
            for n, conn in conns.items():
                scans[n] = tuple(whole_table_reads(explain(conn, stmt, params[n])))
                conn.rollback()
            took: dict[int, list[float]] = {n: [] for n in urls}
            client: dict[int, list[float]] = {n: [] for n in urls}
            for i in range(repeat + 3):  # three to warm up
                for n, conn in conns.items():
                    elapsed = _once(conn, stmt, params[n])
                    on_server = server_ms(explain(conn, stmt, params[n], analyze=True))
                    conn.rollback()
                    if i >= 3:
                        client[n].append(elapsed)
                        took[n].append(on_server)
            for n in urls:
                t = took[n]
                found[n][checked.name] = Timing(
                    statistics.median(t),
                    _percentile(t, 0.1),
                    _percentile(t, 0.9),
                    statistics.median(client[n]),
                    scans[n],
                )
    finally:
        for conn in conns.values():
            conn.close()
        for engine in engines.values():
            engine.dispose()
    return found


def _once(conn: sa.Connection, stmt: sa.ClauseElement, params: dict[str, object]) -> float:
    """Milliseconds of one execution, its rows fetched; a write is rolled back."""
    started = time.perf_counter()
    result = conn.execute(stmt, params)  # type: ignore[call-overload]
    if result.returns_rows:
        result.all()
    elapsed = (time.perf_counter() - started) * 1000
    conn.rollback()
    return elapsed


def table(sizes: list[int], results: dict[int, dict[str, Timing]]) -> str:
    """The table: per statement, each size's median (p10-p90), and each larger
    size's ratio to the smallest."""
    small, larger = sizes[0], sizes[1:]
    head = ["statement", "called by"] + [f"{n:,} runs: server ms (p10-p90); client" for n in sizes]
    head += [f"ratio {n:,}/{small:,}" for n in larger] + ["plan"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for checked in CHECKED:
        cells = [f"`{checked.name}`", checked.role]
        for n in sizes:
            t = results[n][checked.name]
            cells.append(f"{t.median:.3f} ({t.p10:.3f}-{t.p90:.3f}); {t.client:.2f}")
        base = results[small][checked.name].median
        for n in larger:
            ratio = results[n][checked.name].median / base if base else float("inf")
            cells.append(f"{ratio:.2f}x" + ("" if ratio <= TARGET_RATIO else " **over**"))
        scans = sorted({s for n in sizes for s in results[n][checked.name].seq_scans})
        cells.append("Seq Scan on " + ", ".join(scans) if scans else "index")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=scale_data.sizes, default=[10_000, 1_000_000])
    parser.add_argument("--steps-per-run", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--reuse", action="store_true", help="keep (and reuse) the databases")
    args = parser.parse_args(argv)
    sizes = sorted(args.runs)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        urls = {n: scale_data.prepare(n, args.steps_per_run, args.reuse, log) for n in sizes}
        log(f"timing {len(CHECKED)} statements at {len(sizes)} sizes, side by side")
        results = measure(urls, args.repeat)
    finally:
        if not args.reuse:
            for runs in sizes:
                scale_data.drop(runs)
    print(table(sizes, results))


if __name__ == "__main__":
    main()
