"""A backlog of stalled runs, and the sweep called over it until every run was re-sent.

For ``tests/store/test_sweep_backlog.py``: the short form of
``benchmarks/sweep_backlog.py``, which keeps its own copy of these (with its
progress output) so benchmarks and tests import nothing of each other.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from pikku_celery.engine.core import WorkflowEngine
from pikku_celery.lease import InMemoryLeaseService
from pikku_celery.sql.schema import run_table, step_table
from pikku_celery.store.sql import SQLWorkflowStore
from pikku_celery.testing import InlineDispatcher

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


def _step_kind(kind: str, i: int) -> str:
    if kind == "mixed":
        return "lapsed" if i % 2 == 0 else "scheduled"
    return kind


def generate(engine: sa.Engine, runs: int, kind: str, now: int) -> list[str]:
    """``runs`` stalled runs of one step each, by bulk INSERTs; returns their ids.

    Only the columns the measured code's tables have are written (an older
    schema lacks the newer ones; their server defaults fill them)."""
    step_columns = set(step_table.c.keys())
    run_ids: list[str] = []
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
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
    return run_ids


def sweep_until_all_reached(
    store: SQLWorkflowStore,
    run_ids: list[str],
    max_sweeps: int,
    sweep_options: dict[str, Any] | None = None,
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
        if reached == wanted:
            break
    return rows
