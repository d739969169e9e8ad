"""SQLAlchemy table definitions: every pikku table lives on one ``metadata``.

Alembic migrations and ``create_all`` in tests both start from here.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.schema import CreateColumn
from sqlalchemy.sql.compiler import DDLCompiler, SQLCompiler

metadata = sa.MetaData()


def exact_collation(dialect: Dialect) -> str:
    """The MySQL/MariaDB collation under which names compare byte for byte.

    The default collations are case-insensitive (``"Job"`` = ``"job"``), and
    ``utf8mb4_bin`` still pads (``"key "`` = ``"key"``): a NO PAD binary
    collation keeps names apart exactly as PostgreSQL and SQLite do.
    """
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


class ExactString(sa.types.TypeDecorator[str]):
    """A ``VARCHAR`` compared byte for byte on every database (see :func:`exact_collation`)."""

    impl = sa.String
    cache_ok = True

    def __init__(self, length: int = 255) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> sa.types.TypeEngine[Any]:
        """The collated ``VARCHAR`` on MySQL/MariaDB, a plain one elsewhere."""
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(
                mysql.VARCHAR(self.length, charset="utf8mb4", collation=exact_collation(dialect))
            )
        return dialect.type_descriptor(sa.String(self.length))


def _key_string(length: int = 255) -> ExactString:
    return ExactString(length)


# Leases (pikku_celery.lease.sql). One row per key, kept after release so the
# fencing token never goes down. ``expires_at`` is epoch milliseconds on the
# database's clock; 0 means released.
lease_table = sa.Table(
    "pikku_lease",
    metadata,
    sa.Column("key", _key_string(), primary_key=True),
    sa.Column("holder", _key_string(), nullable=False),
    sa.Column("token", sa.BigInteger(), nullable=False),
    sa.Column("expires_at", sa.BigInteger(), nullable=False),
)


# --- the workflow store (pikku_celery.store.sql) -----------------------------
# Times are BIGINT epoch milliseconds on the database clock. JSON payloads are
# TEXT: portable, and the store never queries inside them. Indexes serve the
# claim (primary key), the replay read (run_id, seq) and the sweep queries,
# nothing else. Names, ids and keys compare byte for byte (see _key_string):
# step "Charge" and step "charge" are two steps on every database.

ID = _key_string(36)
NAME = _key_string()
STATUS = sa.String(16)
MS = sa.BigInteger()
CLAIM_ID = _key_string(32)
JSON_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")

LIVE_RUN = sa.text("status = 'running' OR status = 'suspended'")
"""The predicate of the live-run indexes: every status but the terminal ones."""
UNLOOKED_RUN = sa.text("(status = 'running' OR status = 'suspended') AND next_sweep_at IS NULL")
"""Live runs the sweep has not looked at since their last pass."""
RECHECK_RUN = sa.text("(status = 'running' OR status = 'suspended') AND next_sweep_at IS NOT NULL")
"""Live runs the sweep looks at again at ``next_sweep_at``."""
SETTLED_ROOT = sa.text(
    "(status = 'completed' OR status = 'failed' OR status = 'cancelled') AND parent_run_id IS NULL"
)
"""Top-level runs that settled: retention's candidates (an entry is written
once, when a run settles, never by a live run's passes)."""
CHILD_RUN = sa.text("parent_run_id IS NOT NULL")
"""The predicate of the children index: a run some step started."""
KEYED_RUN = sa.text("idempotency_key IS NOT NULL")
"""The predicate of the key index: a run started with an idempotency key."""
UNSETTLED_STEP = sa.text(
    "status = 'pending' OR status = 'scheduled' OR status = 'running' "
    "OR (status = 'failed' AND wake_at IS NOT NULL)"
)
"""The predicate of the live-step index: as the idle sweep spells a step in flight."""

run_table = sa.Table(
    "pikku_workflow_run",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("workflow", NAME, nullable=False),
    sa.Column("status", STATUS, nullable=False),
    sa.Column("input", JSON_TEXT, nullable=True),
    sa.Column("output", JSON_TEXT, nullable=True),
    sa.Column("error", JSON_TEXT, nullable=True),
    sa.Column("idempotency_key", NAME, nullable=True),
    sa.Column("parent_run_id", ID, nullable=True),
    sa.Column("parent_step_id", ID, nullable=True),
    sa.Column("cancel_requested", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("version", sa.BigInteger(), nullable=False),
    sa.Column("wake_at", MS, nullable=True),
    sa.Column("next_sweep_at", MS, nullable=True),
    sa.Column("sweep_count", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("created_at", MS, nullable=False),
    sa.Column("updated_at", MS, nullable=False),
    # how deep under start()'s runs (0): bounds child recursion (Limits.max_child_depth)
    sa.Column("depth", sa.Integer(), nullable=False, server_default="0"),
    # why no pass can run it now (no worker knows its workflow); NULL once one does
    sa.Column("blocked", JSON_TEXT, nullable=True),
    # the version of its workflow the run started on (its replays keep to it)
    sa.Column("workflow_version", ExactString(64), nullable=True),
    # the trace context (W3C carrier, JSON) its spans join, kept for the sweep's re-sends
    sa.Column("trace_context", JSON_TEXT, nullable=True),
    # when the run fails with a timeout (start(timeout=)), on the database clock
    sa.Column("deadline_at", MS, nullable=True),
    # ctx.continue_as_new's chain: the run started in this one's place, and
    # the run this one was started in place of
    sa.Column("continued_as", ID, nullable=True),
    sa.Column("continued_from", ID, nullable=True),
    # Live runs (running, suspended) are a sliver of a table kept for a year:
    # their indexes are partial on PostgreSQL and SQLite, so the sweep and the
    # deploy check read only them (whole on MySQL/MariaDB, same queries).
    # sweep: idle runs (status = 'running' AND updated_at <= cutoff), oldest
    # first, in two ranges: runs not looked at since their last pass
    # (next_sweep_at NULL) by that pass, and runs due a look again (a busy
    # one set aside, a woken one backing off) by next_sweep_at. A pass
    # clears next_sweep_at: a live run is in one of the two at a time.
    sa.Index(
        "ix_pikku_run_live_updated",
        "status",
        "updated_at",
        postgresql_where=UNLOOKED_RUN,
        sqlite_where=UNLOOKED_RUN,
    ),
    sa.Index(
        "ix_pikku_run_live_recheck",
        "status",
        "next_sweep_at",
        postgresql_where=RECHECK_RUN,
        sqlite_where=RECHECK_RUN,
    ),
    # the deploy check: live runs a page at a time by id
    sa.Index(
        "ix_pikku_run_live_id", "status", "id", postgresql_where=LIVE_RUN, sqlite_where=LIVE_RUN
    ),
    # list_runs and the capped counts, newest first: one range per status
    # (merged when no status is asked for), so a page or a count reads what
    # it shows, never the table; the keyset cursor is (created_at, id)
    sa.Index("ix_pikku_run_status_created", "status", "created_at", "id"),
    sa.Index("ix_pikku_run_workflow_status_created", "workflow", "status", "created_at", "id"),
    # a run's children; partial (PostgreSQL, SQLite): a top-level run, most of
    # them, takes no entry, so its passes do not write one
    sa.Index(
        "ix_pikku_run_parent",
        "parent_run_id",
        postgresql_where=CHILD_RUN,
        sqlite_where=CHILD_RUN,
    ),
    # runs_with_key (the run page's search by idempotency key), newest first;
    # partial in the same way: a run started without a key takes no entry.
    # Which run a key names is pikku_workflow_run_key's to say, not this.
    sa.Index(
        "ix_pikku_run_key_created",
        "idempotency_key",
        "created_at",
        postgresql_where=KEYED_RUN,
        sqlite_where=KEYED_RUN,
    ),
    # retention: settled top-level runs, oldest first, one range per status
    sa.Index(
        "ix_pikku_run_settled_root",
        "status",
        "updated_at",
        "id",
        postgresql_where=SETTLED_ROOT,
        sqlite_where=SETTLED_ROOT,
    ),
    # sweep: overdue runs (status = 'running' AND deadline_at <= now); only
    # runs with a deadline enter it
    sa.Index(
        "ix_pikku_run_deadline",
        "status",
        "deadline_at",
        postgresql_where=sa.text("deadline_at IS NOT NULL"),
        sqlite_where=sa.text("deadline_at IS NOT NULL"),
    ),
)

# A start's idempotency key: the run it names, one row per (workflow, key).
# Its own table so the key's uniqueness holds where the runs are sharded by
# run (Citus distributes this one by its key instead): a keyed start inserts
# this row first, on conflict doing nothing, and only the start whose row
# went in inserts the run, in the same transaction.
run_key_table = sa.Table(
    "pikku_workflow_run_key",
    metadata,
    sa.Column("workflow", NAME, primary_key=True),
    sa.Column("idempotency_key", NAME, primary_key=True),
    sa.Column("run_id", ID, nullable=False),
    sa.Column("created_at", MS, nullable=False),
)

# The primary keys of steps and attempts carry the run (a sharded database
# enforces only those), after the step's id: a lookup by step id still seeks
# the primary key.
step_table = sa.Table(
    "pikku_workflow_step",
    metadata,
    sa.Column("id", ID, primary_key=True),
    sa.Column("run_id", ID, sa.ForeignKey("pikku_workflow_run.id"), primary_key=True),
    sa.Column("name", NAME, nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("kind", STATUS, nullable=False),
    sa.Column("status", STATUS, nullable=False),
    sa.Column("task_name", NAME, nullable=True),
    sa.Column("queue", NAME, nullable=True),
    sa.Column("args", JSON_TEXT, nullable=True),
    sa.Column("kwargs", JSON_TEXT, nullable=True),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("max_attempts", sa.Integer(), nullable=False),
    sa.Column("retry_delay", sa.Double(), nullable=False),
    sa.Column("backoff", sa.Double(), nullable=False),
    sa.Column("lease_expires_at", MS, nullable=True),
    sa.Column("wake_at", MS, nullable=True),
    sa.Column("child_run_id", ID, nullable=True),
    sa.Column("result", JSON_TEXT, nullable=True),
    sa.Column("error", JSON_TEXT, nullable=True),
    sa.Column("worker", NAME, nullable=True),
    sa.Column("scheduled_at", MS, nullable=True),
    sa.Column("created_at", MS, nullable=False),
    sa.Column("updated_at", MS, nullable=False),
    # ctx.step's routing options (JSON: exchange, routing_key, priority, queue)
    sa.Column("route", JSON_TEXT, nullable=True),
    # the current claim's random id: outcomes and renewals are fenced on it too
    sa.Column("claim_id", CLAIM_ID, nullable=True),
    # the sweep's per-step backoff: it leaves the step alone until then (0:
    # never re-sent; not NULL, so "never" is an equality an index range keeps
    # its order under), and how often it re-sent it; also its order (re-sent last)
    sa.Column("next_sweep_at", MS, nullable=False, server_default="0"),
    sa.Column("sweep_count", sa.Integer(), nullable=False, server_default="0"),
    # ctx.step(timeout=): how long one attempt's body may run (NULL: no limit)
    sa.Column("timeout_ms", MS, nullable=True),
    # one step per name per run; also serves the replay read (WHERE run_id =
    # ..., a handful of rows sorted by seq) and the idle-run sweep's probe
    sa.UniqueConstraint("run_id", "name", name="uq_pikku_step_run_name"),
    # the idle sweep's probe (has this run a step in flight?) reads only live
    # steps: one run's few, never the settled history of a long run. No
    # status column: no other query may mistake it for a status index, and on
    # MySQL/MariaDB (whole) a status change never rewrites it. The step's id
    # after the run: a statement that names a step and its run, which the
    # planner may take through this index (a new run it has no statistics
    # for), seeks the one entry, not every live step of a wide fan-out
    sa.Index(
        "ix_pikku_step_live_run",
        "run_id",
        "id",
        postgresql_where=UNSETTLED_STEP,
        sqlite_where=UNSETTLED_STEP,
    ),
    # The sweep indexes are partial on PostgreSQL and SQLite: a step row is
    # rewritten on every claim and outcome, and each index a row version
    # enters is a write (and WAL) on the hot path. Settled steps, the bulk
    # of the table, enter none of them. MySQL/MariaDB has no partial
    # indexes: there they are whole, and serve the same queries.
    # Each sweep index has next_sweep_at after status, so each query reads
    # two ranges of it: steps never re-sent (0), by their own time, and
    # steps whose backoff is over, by next_sweep_at; steps in backoff lie in
    # neither range, and a step re-sent moves behind the others.
    # sweep: lapsed leases (status = 'running' AND lease_expires_at <= now)
    sa.Index(
        "ix_pikku_step_sweep_lease",
        "status",
        "next_sweep_at",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'running'"),
        sqlite_where=sa.text("status = 'running'"),
    ),
    # sweep: due timers and retries (status = ... AND wake_at <= now)
    sa.Index(
        "ix_pikku_step_sweep_wake",
        "status",
        "next_sweep_at",
        "wake_at",
        postgresql_where=sa.text("wake_at IS NOT NULL"),
        sqlite_where=sa.text("wake_at IS NOT NULL"),
    ),
    # sweep: messages possibly lost (status = ... AND kind = 'task' AND
    # scheduled_at <= cutoff, or never sent: scheduled_at IS NULL AND
    # created_at <= cutoff). kind is in the index so long-sleeping timers
    # (kind 'sleep', status 'scheduled') are never walked.
    sa.Index(
        "ix_pikku_step_sweep_scheduled",
        "status",
        "kind",
        "next_sweep_at",
        "scheduled_at",
        "created_at",
        postgresql_where=sa.text("status IN ('pending', 'scheduled')"),
        sqlite_where=sa.text("status IN ('pending', 'scheduled')"),
    ),
)

# No foreign key to the step: every attempt row is written from its step row
# in the same statement (the claim) or transaction (a child step), so a key
# check would re-verify, on the hottest write of all, what the write
# guarantees (``benchmarks/store.py`` shows its cost on a claim + complete).
attempt_table = sa.Table(
    "pikku_workflow_step_attempt",
    metadata,
    sa.Column("step_id", ID, primary_key=True),
    sa.Column("attempt", sa.Integer(), primary_key=True),
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("status", STATUS, nullable=False),
    sa.Column("worker", NAME, nullable=True),
    sa.Column("result", JSON_TEXT, nullable=True),
    sa.Column("error", JSON_TEXT, nullable=True),
    sa.Column("started_at", MS, nullable=False),
    sa.Column("finished_at", MS, nullable=True),
    sa.Column("claim_id", CLAIM_ID, nullable=True),  # the claim that made the attempt
    sa.Column("dispatch", _key_string(16), nullable=True),  # how it reached its worker
    # its lease renewals: how many, the last one's time (the run page's timeline)
    sa.Column("renewals", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("renewed_at", MS, nullable=True),
    # the Celery message that carried it (an eager attempt: its carrier's) and
    # Celery's node name of the worker that ran it (host:pid outside a worker)
    sa.Column("task_id", NAME, nullable=True),
    sa.Column("node", NAME, nullable=True),
)

signal_table = sa.Table(
    "pikku_workflow_signal",
    metadata,
    sa.Column("run_id", ID, sa.ForeignKey("pikku_workflow_run.id"), primary_key=True),
    sa.Column("name", NAME, primary_key=True),
    sa.Column("payload", JSON_TEXT, nullable=True),
    sa.Column("created_at", MS, nullable=False),
)

# What operators did to a run (cancel, retry, signal): who, when on the
# database's clock, from where, and with what. Append-only; read per run.
# The id is the database's (a sequence; AUTO_INCREMENT; on SQLite, whose
# rowid a two-column key does not alias, the insert's own max + 1) and the
# trail's order; the key carries the run for a sharded database.
audit_table = sa.Table(
    "pikku_workflow_audit",
    metadata,
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=True),
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("action", _key_string(16), nullable=False),
    sa.Column("actor", NAME, nullable=False),
    sa.Column("origin", NAME, nullable=True),
    sa.Column("details", JSON_TEXT, nullable=True),
    sa.Column("at", MS, nullable=False),
    sa.Index("ix_pikku_audit_run", "run_id", "id"),
)


class NextAuditId(sa.sql.expression.ColumnElement[int]):
    """The id of an audit row being inserted: the column's own default (the
    sequence, AUTO_INCREMENT) where it has one; on SQLite the table's highest
    id + 1, read by the insert itself (SQLite runs one writer at a time)."""

    inherit_cache = True
    type = sa.BigInteger()


@compiles(NextAuditId)
def _next_audit_id(element: NextAuditId, compiler: SQLCompiler, **kw: Any) -> str:
    return "DEFAULT"


@compiles(NextAuditId, "sqlite")
def _next_audit_id_sqlite(element: NextAuditId, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(SELECT coalesce(max(id), 0) + 1 FROM {audit_table.name})"


@compiles(CreateColumn, "sqlite")
def _create_column_sqlite(create: CreateColumn, compiler: DDLCompiler, **kw: Any) -> str:
    """SQLite numbers only a one-column integer key: a database-numbered
    column of a two-column key is a plain one there (see NextAuditId)."""
    column = create.element
    if column.autoincrement is not True or len(column.table.primary_key.columns) == 1:
        return str(compiler.visit_create_column(create, **kw))  # type: ignore[no-untyped-call]
    column.autoincrement = "auto"
    try:
        return str(compiler.visit_create_column(create, **kw))  # type: ignore[no-untyped-call]
    finally:
        column.autoincrement = True


# Concurrency keys (pikku_celery.store.slots_sql): one row per key, the row
# every entry and exit of that key locks first (with an UPDATE that counts
# them in ``writes`` and sets ``max_running``). One slot row per run on a key,
# holding or waiting (``seq``: its start order), deleted once its run
# settles: the table holds live runs only.
concurrency_key_table = sa.Table(
    "pikku_concurrency_key",
    metadata,
    sa.Column("key", NAME, primary_key=True),
    sa.Column("max_running", sa.Integer(), nullable=False),
    sa.Column("writes", sa.BigInteger(), nullable=False),
)

concurrency_slot_table = sa.Table(
    "pikku_concurrency_slot",
    metadata,
    sa.Column("run_id", ID, primary_key=True),
    sa.Column("key", NAME, nullable=False),
    sa.Column("seq", sa.BigInteger(), nullable=False),
    sa.Column("holding", sa.Boolean(), nullable=False),
    # a key's holders, then its waiting runs in start order
    sa.Index("ix_pikku_slot_key", "key", "holding", "seq"),
)

STORE_TABLES = (
    run_table,
    run_key_table,
    step_table,
    attempt_table,
    signal_table,
    audit_table,
    concurrency_key_table,
    concurrency_slot_table,
)
"""The tables :class:`~pikku_celery.store.sql.SQLWorkflowStore` needs."""

# Schedules (pikku_celery.schedule): one row per schedule name, the newest
# tick handled and the next one, epoch milliseconds on the database's clock.
# A tick's run is named by an idempotency key, so the row only says how far
# the schedule got (for catch-up and ``schedules list``), never guards a start.
schedule_table = sa.Table(
    "pikku_schedule",
    metadata,
    sa.Column("name", NAME, primary_key=True),
    sa.Column("workflow", NAME, nullable=False),
    sa.Column("spec", NAME, nullable=False),
    sa.Column("last_tick", MS, nullable=False),
    sa.Column("next_tick", MS, nullable=False),
    sa.Column("last_run_id", ID, nullable=True),
    sa.Column("updated_at", MS, nullable=False),
)
