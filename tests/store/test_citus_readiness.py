"""Past one PostgreSQL: which named statements a database sharded by run routes to one shard.

On Citus every pikku table is distributed by its run (``pikku_workflow_run.id``,
the others' ``run_id``), so a run's rows live on one shard. A statement is
*routed* when every reference to a distributed table is pinned to one run: an
equality of its run column with a parameter, or with the run column of a table
already pinned (a co-located join). Anything else fans out to every shard.

This reads every statement of the registry (portable, PostgreSQL's, MySQL's)
structurally, with no Citus here (no Citus package on these machines: nothing
is run on a cluster). Each statement that is not routed must be listed below,
as multi-shard by design (the sweep, the run page, the deploy check, metrics)
or as a known gap of the hot path (a step addressed by its own id): a new
statement that fans out fails this test until it is routed or listed, and a
listed one that becomes routed must leave the list. The README's "Deploying
on Citus" says the same to a user.
"""

from __future__ import annotations

import operator

import pytest
import sqlalchemy as sa
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BinaryExpression, BindParameter, BooleanClauseList

from pikku_celery.sql.engines import now_ms_expr
from pikku_celery.sql.schema import (
    attempt_table,
    audit_table,
    concurrency_key_table,
    concurrency_slot_table,
    lease_table,
    metadata,
    run_key_table,
    run_table,
    schedule_table,
    signal_table,
    step_table,
)
from pikku_celery.store.statements import Statements
from pikku_celery.store.statements_mysql import MySQLStatements
from pikku_celery.store.statements_postgres import PostgresStatements

RUN_COLUMN = {
    run_table: "id",
    step_table: "run_id",
    attempt_table: "run_id",
    signal_table: "run_id",
    audit_table: "run_id",
}
"""The distribution column of each distributed table."""

MULTI_SHARD_BY_DESIGN = {
    # the sweep: it looks across all runs (each query a bounded index range per shard)
    "lapsed",
    "undispatched",
    "due",
    "idle",
    "note_busy",
    "note_steps_swept",
    "mark_scheduled",
    "redispatch",
    "waiting_by_queue",
    # the run page and `runs list`: lists, capped counts, search, live runs' steps
    "list_runs",
    "count_runs",
    "count_runs_capped",
    "runs_with_key",
    "steps_of_runs",
    # the deploy check: live runs a page at a time, their signals
    "in_flight_runs",
    "signals_of_runs",
    # metrics: counts of everything
    "steps_by_status",
    "attempts_by_status",
    # the sweep's deadlines: overdue runs across all runs
    "overdue",
    # retention: settled run trees across all runs, then their rows by a
    # batch of run ids (each batch one transaction, multi-shard)
    "prune_candidates",
    "prune_count_roots",
    "prune_lock_roots",
    "prune_lock_runs",
    "prune_children",
    "prune_step_ids",
    "prune_count_attempts",
    "prune_count_signals",
    "prune_count_audit",
    "prune_delete_attempts",
    "prune_delete_steps",
    "prune_delete_signals",
    "prune_delete_audit",
    "prune_delete_runs",
    "prune_keys",  # the batch's runs' idempotency keys: read, deleted
    # a caller that did not name the run: the step's run read by its id, once,
    # before the pinned statement (the engine always names it)
    "step_run_of",
}
"""Statements that read across runs on purpose (any shape of a family)."""

HOT_PATH_GAPS: set[str] = set()
"""Hot-path statements not routed yet: the work left for a sharded deployment."""

HOT_PATH_ROUTED = {
    "run_get",
    "run_lock",
    "run_version_lock",
    "run_insert",
    "run_insert_returning",
    "run_start",
    "run_pass",
    "run_end",
    "pass_read",
    "pass_view",
    "steps_of_run",
    "attempts_of_run",
    "steps_page_of_run",
    "step_outlines_of_run",
    "attempts_page_of_run",
    "step_insert",
    "attempt_insert",
    "signal_insert",
    "signal_payload",
    "signals_of_run",
    "run_cancel",
    "close_live_steps",
    "close_live_attempts",
    "settle_parent_step",
    "touch_parent",
    "cancel_child",
    "note_swept",
    "audit_insert",
    "audit_of_run",
    # a step addressed by its id and its run (the message carries both)
    "claim",
    "claim_view",
    "claim_view_durable",
    "step_get",
    "step_task_name",
    "supersede",
    "renew",
    "renew_counted",
    "renew_counted_cte",
    "park",
    "expire",
    "expire_attempt",
    "fenced_step",
    "fenced_attempt",
    "fenced_at_step",
    "fenced_at_attempt",
    "fenced_cte",
    "fenced_cte_at",
    "resolve",
    "resolve_attempt",
    "settle_parent_attempt",
    "pass_write",
    "fenced_both",
    "fenced_both_at",
    "renew_both",
}
"""Statements of the hot path and of one run's page that must stay routed."""


def _base(table: object) -> object:
    while not isinstance(table, sa.Table) and hasattr(table, "element"):
        table = table.element
    return table


def _conjuncts(clause: object) -> list[object]:
    if clause is None:
        return []
    if isinstance(clause, BooleanClauseList) and clause.operator is sa.sql.operators.and_:
        return [c for part in clause.clauses for c in _conjuncts(part)]
    return [clause]


def _is_run_column(column: object) -> bool:
    """A distributed table's run column, or a subquery's column derived from one."""
    for proxy in getattr(column, "proxy_set", ()):
        if isinstance(proxy, sa.Column):
            table = _base(proxy.table)
            if table in RUN_COLUMN and proxy.name == RUN_COLUMN[table]:  # type: ignore[index]
                return True
    return False


def _pins(clause: object, table: sa.Table) -> bool:
    if not isinstance(clause, BinaryExpression) or clause.operator is not operator.eq:
        return False
    for mine, other in ((clause.left, clause.right), (clause.right, clause.left)):
        if (
            isinstance(mine, sa.Column)
            and _base(mine.table) is table
            and mine.name == DISTRIBUTED[table]
        ):
            return isinstance(other, BindParameter) or _is_run_column(other)
    return False


def _leaves(join: sa.Join, conditions: list[object]) -> list[object]:
    conditions.extend(_conjuncts(join.onclause))
    found: list[object] = []
    for side in (join.left, join.right):
        found += _leaves(side, conditions) if isinstance(side, sa.Join) else [side]
    return found


def unpinned_tables(stmt: sa.ClauseElement) -> set[str]:
    """The distributed tables ``stmt`` reads or writes without pinning one run."""
    found: set[str] = set()
    for element in visitors.iterate(stmt):
        if isinstance(element, sa.Update | sa.Delete):
            froms: list[object] = [element.table]
        elif isinstance(element, sa.Select):
            froms = list(element.get_final_froms())
        else:
            continue  # an INSERT of values routes by its run_id value
        conditions = _conjuncts(element.whereclause)
        tables: list[object] = []
        for item in froms:
            tables += _leaves(item, conditions) if isinstance(item, sa.Join) else [item]
        for item in tables:
            table = _base(item)
            if table in DISTRIBUTED and not any(_pins(c, table) for c in conditions):  # type: ignore[arg-type]
                found.add(table.name)  # type: ignore[union-attr]
    return found


def _family(name: str) -> str:
    return name.split("[", 1)[0]


REGISTRIES = {
    "portable": Statements(now_ms_expr("sqlite")),
    "postgresql": PostgresStatements(),
    "mysql": MySQLStatements(),
}


@pytest.mark.parametrize("dialect", sorted(REGISTRIES))
def test_every_statement_is_routed_or_listed(dialect: str) -> None:
    named = REGISTRIES[dialect].named()
    fanning = {n for n, stmt in named.items() if unpinned_tables(stmt)}
    unlisted = {n for n in fanning if _family(n) not in MULTI_SHARD_BY_DESIGN | HOT_PATH_GAPS}
    assert not unlisted, f"statements that fan out over every shard, not listed: {unlisted}"
    for name in named:
        if _family(name) in HOT_PATH_ROUTED:
            assert name not in fanning, (
                f"{name} must address one run: {unpinned_tables(named[name])}"
            )


def test_the_lists_name_real_statements_and_no_routed_one_is_listed() -> None:
    families: dict[str, bool] = {}  # family -> fans out in some registry
    for registry in REGISTRIES.values():
        for name, stmt in registry.named().items():
            families[_family(name)] = families.get(_family(name), False) or bool(
                unpinned_tables(stmt)
            )
    listed = MULTI_SHARD_BY_DESIGN | HOT_PATH_GAPS
    assert listed <= set(families), listed - set(families)
    assert set(families) >= HOT_PATH_ROUTED
    assert {f for f in listed if not families[f]} == set(), "routed now: take it off the list"


def test_the_analysis_tells_a_pinned_statement_from_a_fanning_one() -> None:
    one = sa.select(step_table).where(step_table.c.run_id == sa.bindparam("r"))
    by_step = sa.select(step_table).where(step_table.c.id == sa.bindparam("s"))
    either = sa.select(step_table).where(
        sa.or_(sa.bindparam("r").is_(None), step_table.c.run_id == sa.bindparam("r"))
    )
    joined = (
        sa.select(attempt_table)
        .join(step_table, step_table.c.run_id == attempt_table.c.run_id)
        .where(step_table.c.run_id == sa.bindparam("r"))
    )
    assert unpinned_tables(one) == set()
    assert unpinned_tables(by_step) == {"pikku_workflow_step"}
    assert unpinned_tables(either) == {"pikku_workflow_step"}  # not prunable
    assert unpinned_tables(joined) == set()  # co-located join on the run


UNIQUE_WITHOUT_RUN: set[tuple[str, str]] = set()
"""Unique constraints a distributed table cannot enforce (they lack its run
column): none; each key of a run's rows holds the run."""


KEY_DISTRIBUTED = {run_key_table: "idempotency_key"}
"""Tables distributed by their own key, not by run: a start's idempotency
key names its run from one shard. Their statements pin that key (a start's
lookup and insert) or are listed above as multi-shard (retention)."""

DISTRIBUTED = {**RUN_COLUMN, **KEY_DISTRIBUTED}
"""Every distributed table and its distribution column."""


LOCAL_TABLES = {
    lease_table,
    # keyed by a concurrency key or a schedule's name, not by a run: small
    # tables Citus keeps as reference tables (or on the coordinator)
    concurrency_key_table,
    concurrency_slot_table,
    schedule_table,
}
"""Tables that are not distributed by run."""


def test_unique_constraints_without_the_run_column_are_the_known_gaps() -> None:
    found = set()
    for table in metadata.sorted_tables:
        if table not in DISTRIBUTED:
            assert table in LOCAL_TABLES or table.name.startswith("pikku_alembic"), table
            continue
        for constraint in table.constraints:
            if isinstance(constraint, sa.PrimaryKeyConstraint | sa.UniqueConstraint):
                columns = {c.name for c in constraint.columns}
                if DISTRIBUTED[table] not in columns:
                    found.add((table.name, constraint.name or f"{table.name}_pkey"))
    assert found == UNIQUE_WITHOUT_RUN


def test_a_keyed_start_reads_and_writes_its_key_on_one_shard() -> None:
    for registry in REGISTRIES.values():
        named = registry.named()
        assert unpinned_tables(named["key_run"]) == set()
        assert {"key_insert", "prune_keys[read]", "prune_keys[delete]"} <= set(named)
