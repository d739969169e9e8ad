"""Runs over a year in bulk, straight into PostgreSQL: the data the plans at size read.

For ``tests/store/test_explain_at_size.py``: :func:`generate` fills pikku's
(empty, migrated) tables with ``generate_series`` INSERTs (no Python rows, no
API): ``runs`` runs over a year, ``steps_per_run`` steps each with one attempt
row each. Ninety-nine runs in a hundred are settled; the live hundredth waits
on a held lease, a lapsed lease, a timer or a lost message, in turn. Indexes
and constraints are dropped for the load and made again after it, then the
tables are ANALYZEd. ``benchmarks/scale_data.py`` (its scratch databases and
command line) uses this one: benchmarks may import tests' helpers, tests
import nothing from benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

YEAR_MS = 365 * 86_400_000
TABLES = ("pikku_workflow_run", "pikku_workflow_step", "pikku_workflow_step_attempt")
LIVE_EVERY = 100
"""One run in this many is live (99 % settled)."""
LIVE_KINDS = ("held", "lapsed", "timer", "lost")
"""What a live run waits on, in turn: a step whose lease is held, one whose
lease lapsed, a sleep's timer, a step message sent long ago and lost."""
CHUNK_RUNS = 100_000
WORKFLOWS = 20


@dataclass(frozen=True)
class Shape:
    """What :func:`generate` wrote: sizes and the clock it wrote them against."""

    runs: int
    steps_per_run: int
    now_ms: int

    @property
    def live(self) -> int:
        """How many runs are live."""
        return self.runs // LIVE_EVERY

    def live_of_kind(self, kind: str) -> int:
        """How many live runs wait on ``kind`` (one of :data:`LIVE_KINDS`)."""
        k = LIVE_KINDS.index(kind)
        return sum(1 for n in range(1, self.live + 1) if n % len(LIVE_KINDS) == k)


def _uuid(expr: str) -> str:
    return f"md5({expr})::uuid::text"


# Parameters: :lo, :hi (run numbers of this chunk), :n (runs in all),
# :now (ms), :spr (steps per run). Run i was created at now - YEAR + i * YEAR / n.
_CREATED = f"(:now - {YEAR_MS} + (i::bigint * {YEAR_MS}) / :n)"
_LIVE = f"(i % {LIVE_EVERY} = 0)"
_KIND = f"((i / {LIVE_EVERY}) % {len(LIVE_KINDS)})"  # index into LIVE_KINDS
_EACH_RUN = "generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) AS i"
_EACH_STEP = f"{_EACH_RUN}, generate_series(0, CAST(:spr AS int) - 1) AS j"

RUNS_SQL = f"""
INSERT INTO pikku_workflow_run (id, workflow, status, input, output, error,
    idempotency_key, cancel_requested, version, wake_at, next_sweep_at, sweep_count,
    created_at, updated_at, depth)
SELECT {_uuid("'r' || i")}, 'wf' || ((i + i / {LIVE_EVERY}) % {WORKFLOWS}),
    CASE WHEN {_LIVE} THEN 'running' WHEN i % 50 = 1 THEN 'failed'
         WHEN i % 200 = 3 THEN 'cancelled' ELSE 'completed' END,
    '{{"order": ' || i || '}}',
    CASE WHEN NOT {_LIVE} AND i % 50 <> 1 AND i % 200 <> 3 THEN '{{"ok": true}}' END,
    CASE WHEN i % 50 = 1 AND NOT {_LIVE} THEN '{{"type": "ValueError", "message": "no"}}' END,
    CASE WHEN i % 2 = 0 THEN 'order-' || i END, false, 2 * :spr,
    CASE WHEN {_LIVE} AND {_KIND} = 2 THEN :now + 7 * 86400000 END, NULL, 0,
    {_CREATED}, {_CREATED} + 1000 * :spr, 0
FROM {_EACH_RUN}
"""

# Step j of run i. Settled runs: every step succeeded (a failed run's last
# failed). A live run: all succeeded but its last, which waits.
_LAST = "(j = :spr - 1)"
_WAITS = f"({_LIVE} AND {_LAST})"
STEPS_SQL = f"""
INSERT INTO pikku_workflow_step (id, run_id, name, seq, kind, status, task_name, queue,
    args, kwargs, attempt, max_attempts, retry_delay, backoff, lease_expires_at, wake_at,
    result, error, worker, scheduled_at, created_at, updated_at, claim_id,
    next_sweep_at, sweep_count)
SELECT {_uuid("'s' || i || '.' || j")}, {_uuid("'r' || i")}, 'step-' || j, j,
    CASE WHEN {_WAITS} AND {_KIND} = 2 THEN 'sleep' ELSE 'task' END,
    CASE WHEN NOT {_WAITS} THEN
            CASE WHEN i % 50 = 1 AND NOT {_LIVE} AND {_LAST} THEN 'failed' ELSE 'succeeded' END
         WHEN {_KIND} IN (0, 1) THEN 'running' ELSE 'scheduled' END,
    CASE WHEN {_WAITS} AND {_KIND} = 2 THEN NULL ELSE 'shop.tasks.work' || (j % 5) END,
    'celery', '[' || i || ']', '{{}}',
    CASE WHEN {_WAITS} AND {_KIND} IN (2, 3) THEN 0 ELSE 1 END, 3, 0, 1,
    CASE WHEN {_WAITS} AND {_KIND} = 0 THEN :now + 3600000
         WHEN {_WAITS} AND {_KIND} = 1 THEN {_CREATED} + 60000 END,
    CASE WHEN {_WAITS} AND {_KIND} = 2 THEN :now + 7 * 86400000 END,
    CASE WHEN NOT {_WAITS} THEN '{{"ok": ' || j || '}}' END,
    CASE WHEN i % 50 = 1 AND NOT {_LIVE} AND {_LAST}
         THEN '{{"type": "ValueError", "message": "no"}}' END,
    'celery@host' || (i % 8),
    {_CREATED} + 1000 * j, {_CREATED} + 1000 * j, {_CREATED} + 1000 * j + 500,
    md5('c' || i || '.' || j), 0, 0
FROM {_EACH_STEP}
"""

ATTEMPTS_SQL = f"""
INSERT INTO pikku_workflow_step_attempt (step_id, attempt, run_id, status, worker, result,
    error, started_at, finished_at, claim_id, dispatch, renewals, task_id, node)
SELECT {_uuid("'s' || i || '.' || j")}, 1, {_uuid("'r' || i")},
    CASE WHEN {_WAITS} THEN 'running'
         WHEN i % 50 = 1 AND NOT {_LIVE} AND {_LAST} THEN 'failed' ELSE 'succeeded' END,
    'celery@host' || (i % 8),
    CASE WHEN NOT {_WAITS} THEN '{{"ok": ' || j || '}}' END, NULL,
    {_CREATED} + 1000 * j + 10, CASE WHEN NOT {_WAITS} THEN {_CREATED} + 1000 * j + 500 END,
    md5('c' || i || '.' || j), CASE WHEN j = 0 THEN 'broker' ELSE 'eager' END, 0,
    {_uuid("'t' || i || '.' || j")}, 'celery@host' || (i % 8)
FROM {_EACH_STEP}
WHERE NOT ({_WAITS} AND {_KIND} IN (2, 3))
"""


def _definitions(conn: sa.Connection) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(table, name, definition) of every constraint, and every other index's DDL."""
    constraints = conn.execute(
        sa.text(
            "SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) "
            "FROM pg_constraint c WHERE (c.conrelid::regclass::text = ANY(:t) "
            "OR c.confrelid::regclass::text = ANY(:t)) "
            "AND c.contype IN ('p', 'u', 'f') ORDER BY c.contype = 'f'"  # keys after what they name
        ),
        {"t": list(TABLES)},
    ).all()
    indexes = conn.execute(
        sa.text(
            "SELECT indexdef FROM pg_indexes WHERE tablename = ANY(:t) AND indexname NOT IN "
            "(SELECT conname FROM pg_constraint WHERE contype IN ('p', 'u'))"
        ),
        {"t": list(TABLES)},
    ).scalars()
    return [(t, n, d) for t, n, d in constraints], list(indexes)


@contextmanager
def _without_indexes(conn: sa.Connection) -> Iterator[None]:
    """Drop the tables' indexes and constraints for a bulk load; make them again after."""
    constraints, indexes = _definitions(conn)
    for table, name, _ in reversed(constraints):
        conn.exec_driver_sql(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    for ddl in indexes:
        name = ddl.split(" INDEX ", 1)[1].split(" ON ", 1)[0]
        conn.exec_driver_sql(f"DROP INDEX {name}")
    conn.commit()
    yield
    conn.exec_driver_sql("SET maintenance_work_mem = '512MB'")
    for table, name, definition in constraints:
        conn.exec_driver_sql(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        conn.commit()
    for ddl in indexes:
        conn.exec_driver_sql(ddl)
        conn.commit()


def generate(
    engine: sa.Engine,
    runs: int,
    steps_per_run: int = 10,
    log: Callable[[str], None] | None = None,
) -> Shape:
    """Fill pikku's (empty, migrated) tables with ``runs`` runs in bulk SQL; ANALYZE them."""
    with engine.connect() as conn:
        now = int(
            conn.exec_driver_sql("SELECT (extract(epoch from now()) * 1000)::bigint").scalar()
        )
        conn.commit()
        started = time.perf_counter()
        with _without_indexes(conn):
            for lo in range(1, runs + 1, CHUNK_RUNS):
                params = {
                    "lo": lo,
                    "hi": min(lo + CHUNK_RUNS - 1, runs),
                    "n": runs,
                    "now": now,
                    "spr": steps_per_run,
                }
                for sql in (RUNS_SQL, STEPS_SQL, ATTEMPTS_SQL):
                    conn.execute(sa.text(sql), params)
                conn.commit()
                if log:
                    took = time.perf_counter() - started
                    log(f"  {params['hi']:>9,}/{runs:,} runs ({took:.0f} s)")
        if log:
            log(f"  indexes made ({time.perf_counter() - started:.0f} s)")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
    return Shape(runs, steps_per_run, now)
