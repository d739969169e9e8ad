"""Which named statements must stay index-served at size, and how to bind and EXPLAIN them.

For ``tests/store/test_explain_at_size.py`` (EXPLAINs them) and
``benchmarks/scale.py`` (times them at each size, with ``analyze``). A
statement is named as in
:meth:`~pikku_celery.store.statements.Statements.named`, and bound with
values read from the generated data (:mod:`tests.scale_data`), so its plan is
the one a real call gets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

BIG_TABLES = ("pikku_workflow_run", "pikku_workflow_step", "pikku_workflow_step_attempt")
"""The tables that grow with every run: none may be read whole."""

STEP_ID_STATEMENTS = re.compile(
    r"^(claim|claim_view|claim_view_durable|fenced_\w+|renew\w*|park|expire\w*|supersede"
    r"|resolve\w*|step_get|step_task_name|settle_parent_\w+)(\[.*\])?$"
)
"""Statements whose ``p_id`` is a step's id (the rest name a run)."""


@dataclass(frozen=True)
class Checked:
    """A statement checked at size: its name, what calls it, and fixed parameters."""

    name: str
    role: str
    params: Mapping[str, Any]


def _filters(prefix: str, names: tuple[str, ...]) -> list[str]:
    shapes = [""]
    for name in names:
        shapes += [f"{s},{name}" if s else name for s in shapes]
    return [f"{prefix}[{s}]" for s in shapes]


RUN_FILTERS = ("status", "workflow", "since", "until")
LIST_SHAPES = (*RUN_FILTERS, "before")

CHECKED: tuple[Checked, ...] = (
    Checked("claim_view", "claim (a step message)", {}),
    Checked("claim_view_durable", "claim (durable)", {}),
    Checked("claim", "claim (portable)", {}),
    Checked("pass_view", "the pass: its read", {}),
    Checked("pass_read", "the pass: its read (locked)", {}),
    Checked("pass_write[complete,step]", "the pass: outcome + next step", {}),
    Checked("pass_write[complete,step,eager]", "the pass: eager next step", {}),
    Checked("pass_write[complete,ends]", "the pass: last step, run ends", {}),
    Checked("fenced_cte[complete]", "outcome (standalone)", {}),
    Checked("renew_counted_cte", "lease renewal", {}),
    Checked("lapsed", "sweep: lapsed leases", {}),
    Checked("undispatched", "sweep: lost messages", {}),
    Checked("due", "sweep: due timers", {}),
    Checked("idle", "sweep: idle runs", {}),
    *(Checked(n, "run page / runs list", {}) for n in _filters("list_runs", LIST_SHAPES)),
    *(
        Checked(n, "run page: capped counts", {})
        for n in _filters("count_runs_capped", RUN_FILTERS[1:])
    ),
    Checked("runs_with_key", "run page: search by key", {}),
    Checked("steps_of_runs", "run page: what live runs wait for", {}),
    Checked("in_flight_runs", "deploy check: live runs", {}),
    Checked("signals_of_runs", "deploy check: their signals", {}),
    Checked("run_get", "runs show", {}),
    Checked("steps_of_run", "runs show: steps", {}),
    Checked("attempts_of_run", "runs show: attempts", {}),
    Checked("steps_page_of_run", "run page / runs show: a page of steps", {}),
    Checked("step_outlines_of_run", "run page / runs show: every step, no payloads", {}),
    Checked("attempts_page_of_run", "run page / runs show: its attempts", {}),
)


@dataclass(frozen=True)
class Sample:
    """Real ids and values from the generated data that statements are bound with."""

    run_id: str  # a live run
    step_id: str  # its waiting step (a lost message: claimable)
    task_name: str
    workflow: str
    since: int
    until: int
    before_at: int  # a page's cursor: the sample run's
    live_run_ids: tuple[str, ...]


def sample(conn: sa.Connection) -> Sample:
    """Ids from the data: a live run whose step lost its message, and a page of live runs."""
    row = conn.exec_driver_sql(
        "SELECT s.run_id, s.id, s.task_name, r.workflow, r.created_at FROM pikku_workflow_step s "
        "JOIN pikku_workflow_run r ON r.id = s.run_id "
        "WHERE s.status = 'scheduled' AND s.kind = 'task' LIMIT 1"
    ).one()
    live = conn.exec_driver_sql(
        "SELECT id FROM pikku_workflow_run WHERE status = 'running' LIMIT 50"
    ).scalars()
    created = int(row[4])
    return Sample(
        run_id=row[0],
        step_id=row[1],
        task_name=row[2],
        workflow=row[3],
        since=created - 86_400_000,
        until=created + 86_400_000,
        before_at=created,
        live_run_ids=tuple(live),
    )


NAMED_VALUES: dict[str, Any] = {
    "p_limit": 50,
    "p_offset": 0,
    "p_reach": 50,
    "p_bound_ms": 7_200_000,
    "p_older_ms": 30_000,
    "p_idle_ms": 60_000,
    "p_lease_ms": 60_000,
    "p_backoff_ms": 5_000,
    "p_max_backoff_ms": 300_000,
    "p_status": "running",
    "p_attempt": 1,
    "p_version": 1,
    "p_cap": 10_001,
}


def bind(stmt: sa.ClauseElement, name: str, s: Sample) -> dict[str, Any]:
    """Values for every parameter of the statement not fixed in it, taken from ``s``."""
    values: dict[str, Any] = {}
    for key, param in stmt.compile().binds.items():
        if param.value is not None or param.callable is not None:
            continue
        values[key] = _value(key, param, name, s)
    return values


def _value(key: str, param: sa.BindParameter[Any], name: str, s: Sample) -> Any:
    if key in NAMED_VALUES:
        return NAMED_VALUES[key]
    if key == "p_ids":
        return list(s.live_run_ids) if name.endswith("_of_runs") else [s.step_id]
    if key == "p_id":
        return s.step_id if STEP_ID_STATEMENTS.match(name) else s.run_id
    if key in ("p_run", "r_id", "n_run_id", "a_run_id"):
        return s.run_id
    if key == "p_task":
        return s.task_name
    if key == "p_workflow":
        return s.workflow
    if key == "p_since":
        return s.since
    if key == "p_until":
        return s.until
    if key == "p_before_at":
        return s.before_at
    if key == "p_before_id":
        return s.run_id
    if key == "p_after":
        return ""
    python = _python_type(param.type)
    if python is int:
        return 1
    if python is float:
        return 0.0
    if python is bool:
        return False
    return f"x-{key}"


def _python_type(type_: sa.types.TypeEngine[Any]) -> type | None:
    try:
        return type_.python_type
    except NotImplementedError:
        return None


SEQ_SCAN = re.compile(r"Seq Scan on (" + "|".join(BIG_TABLES) + r")\b")


def _explained(conn: sa.Connection, cursor: Any, statement: str, *rest: Any) -> tuple[str, Any]:
    return "EXPLAIN " + statement, rest[0]


def _analyzed(conn: sa.Connection, cursor: Any, statement: str, *rest: Any) -> tuple[str, Any]:
    return "EXPLAIN (ANALYZE, TIMING OFF) " + statement, rest[0]


def explain(
    conn: sa.Connection, stmt: sa.ClauseElement, params: Mapping[str, Any], analyze: bool = False
) -> str:
    """PostgreSQL's plan of ``stmt`` with ``params``: not run, or with ``analyze``
    run (a write too: roll it back) and timed by the server."""
    hook = _analyzed if analyze else _explained
    sa.event.listen(conn, "before_cursor_execute", hook, retval=True)
    try:
        result = conn.execute(stmt, dict(params))  # type: ignore[call-overload]
        return "\n".join(row[0] for row in result.cursor.fetchall())
    finally:
        sa.event.remove(conn, "before_cursor_execute", hook)


EXECUTION_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")


def server_ms(plan: str) -> float:
    """The execution time an EXPLAIN ANALYZE reports (the server's own, no round trip)."""
    found = EXECUTION_TIME.search(plan)
    if found is None:
        raise ValueError(f"no execution time in the plan:\n{plan}")
    return float(found.group(1))


def whole_table_reads(plan: str) -> list[str]:
    """The big tables the plan reads whole (a sequential scan)."""
    return sorted(set(SEQ_SCAN.findall(plan)))
