"""The sweep over a backlog of stalled runs: how many sweeps until every run was re-sent.

    python benchmarks/sweep_backlog.py [--runs 100000] [--db postgres|sqlite]
        [--kind mixed|lapsed|scheduled] [--max-sweeps 30] [--old-code DIR]

Bulk-generates ``--runs`` stalled runs straight into the tables (one step each:
a lapsed lease whose worker is gone, or a message sent long ago and lost;
``mixed`` alternates them) in a scratch database it creates and drops
(PostgreSQL by default, ``PIKKU_TEST_PG_URL`` as the admin URL; or a SQLite
file), then calls the sweep back to back with a dispatcher that only records
what was sent. Nothing claims a step, so every re-sent step stays stalled, as
when no worker consumes its queue: the case where the sweep's own backoff
used to starve everything behind its first batch.

It prints, per sweep, the steps re-sent, the runs reached for the first time,
the runs reached so far and the time the sweep took, and the number of sweeps
until every run was reached. ``--old-code DIR`` runs the same in a subprocess
on the ``pikku_celery`` package found in DIR (an export of an older commit:
``git archive <commit> | tar -x -C DIR``) and prints its table first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def _code_root(argv: list[str]) -> Path:
    """The checkout whose ``pikku_celery`` is measured (``--code``, else this one)."""
    if "--code" in argv:
        return Path(argv[argv.index("--code") + 1]).resolve()
    return Path(__file__).resolve().parents[1]


if __name__ == "__main__":
    sys.path.insert(0, str(_code_root(sys.argv)))

import sqlalchemy as sa  # noqa: E402

from pikku_celery.engine.core import WorkflowEngine  # noqa: E402
from pikku_celery.lease import InMemoryLeaseService  # noqa: E402
from pikku_celery.sql.schema import run_table, step_table  # noqa: E402
from pikku_celery.store.migrate import upgrade  # noqa: E402
from pikku_celery.store.sql import SQLWorkflowStore  # noqa: E402
from pikku_celery.store.sql_for import store_for  # noqa: E402
from pikku_celery.testing import InlineDispatcher  # noqa: E402

PG_ADMIN = os.environ.get("PIKKU_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
KINDS = ("mixed", "lapsed", "scheduled")
CHUNK = 5000
STALE_MS = 600_000  # how long ago the stalled steps' leases ended / messages were sent


@dataclass
class SweepRow:
    """One sweep of the backlog."""

    sweep: int
    resent: int  # step messages sent by this sweep
    new_runs: int  # runs it reached that no earlier sweep had
    reached: int  # runs reached so far
    seconds: float


@dataclass
class Backlog:
    """A whole measurement: what was generated and each sweep over it."""

    code: str
    db: str
    runs: int
    kind: str
    generate_seconds: float = 0.0
    sweeps: list[SweepRow] = field(default_factory=list)

    @property
    def sweeps_needed(self) -> int | None:
        """Sweeps until every run was reached; None if they never all were."""
        for row in self.sweeps:
            if row.reached == self.runs:
                return row.sweep
        return None


def _step_kind(kind: str, i: int) -> str:
    if kind == "mixed":
        return "lapsed" if i % 2 == 0 else "scheduled"
    return kind


def generate(engine: sa.Engine, runs: int, kind: str, now: int, progress: bool = True) -> list[str]:
    """``runs`` stalled runs of one step each, by bulk INSERTs; returns their ids.

    Only the columns the measured code's tables have are written (an older
    schema lacks the newer ones; their server defaults fill them)."""
    step_columns = set(step_table.c.keys())
    run_ids: list[str] = []
    started = time.perf_counter()
    for first in range(0, runs, CHUNK):
        run_rows: list[dict[str, Any]] = []
        step_rows: list[dict[str, Any]] = []
        for i in range(first, min(first + CHUNK, runs)):
            rid = str(uuid.uuid4())
            run_ids.append(rid)
            created = now - STALE_MS - 100_000
            stalled_at = now - STALE_MS + i  # distinct, oldest first
            run_rows.append(
                {
                    "id": rid,
                    "workflow": "bench.backlog",
                    "status": "running",
                    "input": "{}",
                    "cancel_requested": False,
                    "version": 2,
                    "sweep_count": 0,
                    "created_at": created,
                    "updated_at": created,
                }
            )
            lapsed = _step_kind(kind, i) == "lapsed"
            step = {
                "id": str(uuid.uuid4()),
                "run_id": rid,
                "name": "only",
                "seq": 0,
                "kind": "task",
                "status": "running" if lapsed else "scheduled",
                "task_name": "bench.work",
                "args": "[]",
                "kwargs": "{}",
                "attempt": 1 if lapsed else 0,
                "max_attempts": 3,
                "retry_delay": 0.0,
                "backoff": 1.0,
                "lease_expires_at": stalled_at if lapsed else None,
                "worker": "gone" if lapsed else None,
                "claim_id": "c" * 32 if lapsed else None,
                "scheduled_at": stalled_at,
                "created_at": created,
                "updated_at": stalled_at,
            }
            step_rows.append({k: v for k, v in step.items() if k in step_columns})
        with engine.begin() as conn:
            conn.execute(run_table.insert(), run_rows)
            conn.execute(step_table.insert(), step_rows)
        if progress:
            done = first + len(run_rows)
            took = time.perf_counter() - started
            print(f"  generated {done:>7}/{runs} runs ({took:5.1f} s)", file=sys.stderr, flush=True)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
    return run_ids


def sweep_until_all_reached(
    store: SQLWorkflowStore,
    run_ids: list[str],
    max_sweeps: int,
    sweep_options: dict[str, Any] | None = None,
    progress: bool = True,
    **engine_options: Any,
) -> list[SweepRow]:
    """Sweep back to back until every run was re-sent (or ``max_sweeps``)."""
    dispatcher = InlineDispatcher(lease_ms=60_000)
    options: dict[str, Any] = {"message_grace": 30.0, "idle_after": 3600.0, **engine_options}
    engine = WorkflowEngine(store, InMemoryLeaseService(), dispatcher, **options)
    dispatcher.engine = engine
    wanted = set(run_ids)
    reached: set[str] = set()
    rows: list[SweepRow] = []
    for n in range(1, max_sweeps + 1):
        dispatcher.sent.clear()
        dispatcher.messages.clear()
        started = time.perf_counter()
        engine.sweep(**(sweep_options or {}))
        took = time.perf_counter() - started
        runs = {m.run_id for m in dispatcher.sent if m.kind == "step"}
        new = (runs & wanted) - reached
        reached |= new
        rows.append(SweepRow(n, len(dispatcher.sent), len(new), len(reached), round(took, 3)))
        if progress:
            print(
                f"  sweep {n}: re-sent {rows[-1].resent}, reached {len(reached)} ({took:.2f} s)",
                file=sys.stderr,
                flush=True,
            )
        if reached == wanted:
            break
    return rows


@contextmanager
def scratch_url(db: str) -> Iterator[str]:
    """A scratch database, dropped afterwards: PostgreSQL or a SQLite file."""
    if db == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/backlog.db"
        return
    name = f"pikku_backlog_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield sa.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        admin.dispose()


def measure(code: str, db: str, runs: int, kind: str, max_sweeps: int) -> Backlog:
    """Generate the backlog in a scratch database and sweep it until all are reached."""
    result = Backlog(code=code, db=db, runs=runs, kind=kind)
    with scratch_url(db) as url:
        upgrade(url)
        engine = sa.create_engine(url)
        try:
            store = store_for(engine)
            started = time.perf_counter()
            run_ids = generate(engine, runs, kind, store.now_ms())
            result.generate_seconds = round(time.perf_counter() - started, 1)
            result.sweeps = sweep_until_all_reached(store, run_ids, max_sweeps)
        finally:
            engine.dispose()
    return result


def render(result: Backlog) -> str:
    """The table of one measurement."""
    needed = result.sweeps_needed
    verdict = (
        f"all {result.runs} runs re-sent within {needed} sweep(s)"
        if needed is not None
        else f"NOT all re-sent after {len(result.sweeps)} sweeps "
        f"({result.sweeps[-1].reached if result.sweeps else 0} of {result.runs})"
    )
    lines = [
        f"{result.code}: {result.runs} stalled runs ({result.kind}) on {result.db}, "
        f"generated in {result.generate_seconds} s; {verdict}",
        f"{'sweep':>5} {'re-sent':>8} {'new runs':>9} {'reached':>8} {'seconds':>8}",
    ]
    for row in result.sweeps:
        lines.append(
            f"{row.sweep:>5} {row.resent:>8} {row.new_runs:>9} {row.reached:>8} {row.seconds:>8.3f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--kind", choices=KINDS, default="mixed")
    parser.add_argument("--max-sweeps", type=int, default=30)
    parser.add_argument("--old-code", help="a directory holding an older pikku_celery to compare")
    parser.add_argument("--code", help=argparse.SUPPRESS)  # read before the imports
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    label = f"code in {args.code}" if args.code else "this checkout"
    if args.old_code:
        old = subprocess.run(
            [
                *(sys.executable, __file__, "--code", args.old_code, "--json"),
                *("--runs", str(args.runs), "--db", args.db, "--kind", args.kind),
                *("--max-sweeps", str(args.max_sweeps)),
            ],
            stdout=subprocess.PIPE,
            check=True,
            text=True,
        )
        print(render(_from_json(json.loads(old.stdout))) + "\n", flush=True)
    result = measure(label, args.db, args.runs, args.kind, args.max_sweeps)
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(render(result))
    return 0


def _from_json(data: dict[str, Any]) -> Backlog:
    rows = [SweepRow(**r) for r in data.pop("sweeps")]
    return Backlog(**data, sweeps=rows)


if __name__ == "__main__":
    sys.exit(main())
