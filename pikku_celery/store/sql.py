"""The workflow store on SQL (SQLAlchemy Core): the portable store, SQLite's as it is.

It behaves exactly as :class:`~pikku_celery.store.memory.InMemoryWorkflowStore`
(the reference); the conformance suite runs both. Statements are built once
per dialect and named (:mod:`.statements`). Ownership writes (claim,
complete, fail, refresh) are each guarded statements judged on the
database's clock, so whoever's write matched owns the attempt, whatever the
workers' clocks say. A pass reads, decides with no transaction open, then
writes under the run's row lock if no pass landed in between.

The store is one class made of a class per concept: its reads for people
(:mod:`.sql_reads`), its steps' ownership writes (:mod:`.sql_steps`), its side
of a pass (:mod:`.sql_pass`) and the sweep (:mod:`.sql_sweep`); runs live here.

:func:`~.sql_for.store_for` builds the store for an engine's dialect:
:class:`~.sql_postgres.PostgresWorkflowStore` and
:class:`~.sql_mysql.MySQLWorkflowStore` override only what their database
does in fewer round trips. This class is the whole behaviour; SQLite runs it
as it is, and ``SQLWorkflowStore(engine)`` is this portable store on any
database (correct everywhere, without a dialect's fast paths).

The store keeps no state between calls but the engine, so a dropped
connection costs one failed call (the pool replaces it), never a wedged store.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar

import sqlalchemy as sa

from ..errors import (
    RunNotFoundError,
    RunSettledError,
    SchemaMissingError,
    StoreError,
    StoreUnavailableError,
)
from ..model.changes import run_created
from ..model.cursor import RunCursor
from ..model.values import (
    JSON,
    AuditAction,
    AuditEntry,
    NewRun,
    Operator,
    RunState,
    RunStatus,
)
from ..payload import dumps, read_stored
from ..sql.dialect import create
from ..sql.engines import now_ms_expr
from ..sql.pooler import Pooler, check_pooler, use_pooler
from ..sql.runner import Runner, SQLAlchemyRunner
from ..sql.schema import STORE_TABLES
from .rows import (
    SIGNAL_PLACE,
    audit_from,
    deadline_of,
    run_from,
    run_params,
)
from .rules import check_resent
from .slots_sql import SQLConcurrencySlots
from .sql_base import _prepared
from .sql_pass import SQLPasses
from .sql_reads import SQLReads
from .sql_sweep import SQLSweep
from .statements import Statements

UPGRADE_COMMAND = "pikku-celery db upgrade --database-url {url}"


def hidden_url(url: sa.URL | str) -> str:
    """The URL with its password masked, fit for messages and logs."""
    return sa.make_url(url).render_as_string(hide_password=True)


def check_schema(
    engine: sa.Engine, tables: Sequence[sa.Table] = STORE_TABLES, command: str | None = None
) -> None:
    """Raise :class:`SchemaMissingError` naming the command to run (``command``,
    else ``pikku-celery db upgrade ...``) when any of ``tables`` or their
    columns is missing. One inspector pass."""
    inspector = sa.inspect(engine)
    present = set(inspector.get_table_names())
    problems: list[str] = []
    wanted = [t for t in tables if t.name in present]
    problems += [f"table {t.name} is missing" for t in tables if t.name not in present]
    if wanted:
        columns = inspector.get_multi_columns(filter_names=[t.name for t in wanted])
        found = {key[1]: {c["name"] for c in cols} for key, cols in columns.items()}
        for t in wanted:
            missing = [c.name for c in t.columns if c.name not in found.get(t.name, set())]
            if missing:
                problems.append(f"table {t.name} lacks column(s) {', '.join(missing)}")
    if problems:
        url = hidden_url(engine.url)
        raise SchemaMissingError(
            f"pikku-celery's tables are missing or out of date in {url}: "
            f"{'; '.join(problems)}. Create or upgrade them with: "
            + (command or UPGRADE_COMMAND.format(url=f"'{url}'"))
        )


@functools.cache
def _portable_statements(dialect_name: str) -> Statements:
    return Statements(now_ms_expr(dialect_name))


class SQLWorkflowStore(SQLReads, SQLSweep, SQLPasses):
    """A :class:`~pikku_celery.ports.store.WorkflowStore` on a SQLAlchemy engine.

    On PostgreSQL and MySQL/MariaDB the tables must exist (``pikku-celery db
    upgrade``); a missing table or column raises :class:`SchemaMissingError`
    on first use (:meth:`prepare`), before anything is written; building the
    store touches no database. For SQLite (the embedded default) the tables
    are created on first use unless ``create_tables=False``. Build
    SQLite engines with :func:`pikku_celery.sql.engines.make_engine`: its ``BEGIN
    IMMEDIATE`` is what serialises writers there.
    """

    creates_tables: ClassVar[bool] = True
    """Whether first use creates the tables where the database is embedded
    (SQLite; a server's tables come from ``db upgrade``), unless
    ``create_tables=`` says otherwise."""

    def __init__(
        self,
        engine: sa.Engine,
        *,
        create_tables: bool | None = None,
        upgrade_command: str | None = None,
        durable_claims: bool = False,
        pooler: Pooler | None = None,
    ) -> None:
        self._engine = engine
        self.pooler = check_pooler(pooler, engine)
        """The pooler in front of PostgreSQL (``"transaction"``, ``"session"``,
        None: none): see :mod:`pikku_celery.sql.pooler`."""
        use_pooler(engine, self.pooler)
        self.durable_claims = durable_claims
        """Whether a claim from a message waits for its commit to be durable
        (PostgreSQL commits it asynchronously otherwise; elsewhere it always waits)."""
        self.statements = self._make_statements()
        """Every statement this store runs, by name: ``statements.named()``."""
        self._single = self._single_statement_engine()
        self.runner: Runner = self._make_runner()
        """How a single statement runs (plain SQLAlchemy here)."""
        if create_tables is None:
            create_tables = self.creates_tables and create(engine).embedded
        self._create_tables = create_tables
        self._upgrade_command = upgrade_command
        self._ready = False
        self._ready_lock = threading.Lock()
        self._setup()

    # --- what a dialect's store overrides to build itself ----------------------
    def _setup(self) -> None:
        """The dialect's own state, once the store is built."""

    def _make_statements(self) -> Statements:
        return _portable_statements(self._engine.dialect.name)

    def _single_statement_engine(self) -> sa.Engine:
        """The engine single statements run on, each in its own transaction."""
        return self._engine

    def _make_runner(self) -> Runner:
        return SQLAlchemyRunner(self._single.begin)

    def _learn(self) -> None:
        """What the connections can do, learnt once by :meth:`prepare`."""

    def close(self) -> None:
        """Close the engine's pooled connections (it opens new ones when used again)."""
        self._engine.dispose(close=True)

    def prepare(self) -> None:
        """Check the schema (creating it first where :attr:`creates_tables`)
        and learn what the connection can do; done once, on first use.

        Building a store touches no database, so importing an app (a Django
        ``makemigrations``, ``pikku-celery db upgrade`` itself) works before
        the tables exist. A missing table or column raises
        :class:`SchemaMissingError` naming the command to run, before the
        call that needed it writes anything; the next call checks again.
        """
        with self._ready_lock:
            if self._ready:
                return
            engine = self._engine
            try:
                if self._create_tables:
                    from .migrate import ensure_current

                    ensure_current(engine)
                check_schema(engine, command=self._upgrade_command)
                self._learn()
            except sa.exc.DBAPIError as exc:
                first = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
                raise StoreUnavailableError(
                    f"the workflow database {hidden_url(engine.url)} is unreachable: {first}"
                ) from None
            self._ready = True

    def is_transient(self, exc: BaseException) -> bool:
        """A lost connection or a database restarting: worth a retry."""
        return isinstance(exc, sa.exc.DBAPIError) and (
            exc.connection_invalidated
            or isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError))
        )

    @property
    def engine(self) -> sa.Engine:
        """The SQLAlchemy engine the store writes through."""
        return self._engine

    def concurrency_slots(self) -> SQLConcurrencySlots:
        """Its concurrency slots (see :mod:`.slots`), in the same database."""
        return SQLConcurrencySlots(self._engine, lambda: None if self._ready else self.prepare())

    def sweep_statements(self) -> dict[str, sa.ClauseElement]:
        """The sweep queries, for EXPLAIN (tests, DBAs checking their plans)."""
        named = self.statements.named()
        return {
            "lapsed_steps": named["lapsed"],
            "undispatched_steps": named["undispatched"],
            "due_steps": named["due"],
            "idle_runs": named["idle"],
            "overdue_runs": named["overdue"],
        }

    # --- clock ---------------------------------------------------------------
    @_prepared
    def now_ms(self) -> int:
        with self._one() as conn:
            return int(conn.execute(self.statements.now).scalar_one())

    # --- runs ----------------------------------------------------------------
    @_prepared
    def create_run(self, new: NewRun) -> tuple[RunState, bool]:
        text = dumps(new.input, f"workflow {new.workflow!r}", "input")
        key = {"p_workflow": new.workflow, "p_key": new.idempotency_key}
        try:
            made = self._insert_run(new, key, run_params(new, text))
            if isinstance(made, RunState):
                return made, False  # the run with that idempotency key
            now, updated = made
            run = replace(run_created(new, json.loads(text), int(now)), updated_at=int(updated))
            return run, True
        except sa.exc.IntegrityError:
            if new.idempotency_key is not None:
                with self._one() as conn:
                    found = self._run_with_key(conn, key)
                if found is not None:  # a concurrent start with the same key won
                    return found, False
            raise StoreError(f"a workflow run with id {new.id!r} already exists") from None

    def _insert_run(
        self, new: NewRun, key: dict[str, Any], params: dict[str, Any]
    ) -> RunState | tuple[int, int]:
        """Insert the run; its (created_at, updated_at), or the run already
        started with that idempotency key. The key's row goes first, in the
        same transaction: only the start that wrote it inserts the run."""
        with self._engine.begin() as conn:
            if new.idempotency_key is not None and not self._key_written(conn, new, key):
                found = self._run_with_key(conn, key)
                if found is None:
                    raise StoreError(
                        f"idempotency key {new.idempotency_key!r} of workflow "
                        f"{new.workflow!r} names a run that is gone (pruned as it started)"
                    )
                return found
            return self._insert_run_row(conn, new, params)

    def _key_written(self, conn: sa.Connection, new: NewRun, key: dict[str, Any]) -> bool:
        """Whether this start wrote the key's row (False: a dialect's insert
        did nothing, the key is another start's)."""
        done = conn.execute(self.statements.key_insert, {**key, "p_id": new.id})
        return done.first() is not None if done.returns_rows else done.rowcount != 0

    def _insert_run_row(
        self, conn: sa.Connection, new: NewRun, params: dict[str, Any]
    ) -> tuple[int, int]:
        """The run's row, stamped on the database's clock: (created_at, updated_at)."""
        now = int(conn.execute(self.statements.now).scalar_one())
        stamped = {"created_at": now, "updated_at": now, "deadline_at": deadline_of(new, now)}
        conn.execute(self.statements.run_insert, {**params, **stamped})
        return now, now

    def _run_with_key(self, conn: sa.Connection, key: dict[str, Any]) -> RunState | None:
        """The run an idempotency key names, if any: the key's row, then the run by id."""
        run_id = conn.execute(self.statements.key_run, key).scalar()
        if run_id is None:
            return None
        row = conn.execute(self.statements.run_get, {"p_id": run_id}).first()
        return None if row is None else run_from(row)

    @_prepared
    def get_run(self, run_id: str) -> RunState | None:
        """The run, or None if there is no run with that id."""
        rows = self.runner.rows(self.statements.run_get, {"p_id": run_id})
        return run_from(rows[0]) if rows else None

    @_prepared
    def list_runs(
        self,
        *,
        status: RunStatus | None = None,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 50,
        offset: int = 0,
        before: RunCursor | None = None,
    ) -> list[RunState]:
        stmt = self.statements.list_runs(
            status is not None,
            workflow is not None,
            since is not None,
            until is not None,
            before is not None,
        )
        params = {
            "p_status": None if status is None else RunStatus(status).value,
            "p_workflow": workflow,
            "p_since": since,
            "p_until": until,
            "p_limit": limit,
            "p_offset": offset,
            "p_reach": limit + offset,
            "p_before_at": None if before is None else before.created_at,
            "p_before_id": None if before is None else before.run_id,
        }
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(stmt, params)]

    def _locked_run(self, conn: sa.Connection, run_id: str) -> tuple[RunState, int]:
        """Lock the run row for this transaction, then read the DB clock."""
        row = conn.execute(self.statements.run_lock, {"p_id": run_id}).first()
        if row is None:
            raise RunNotFoundError(f"no workflow run {run_id!r}")
        return run_from(row), int(conn.execute(self.statements.now).scalar_one())

    def _reread(self, conn: sa.Connection, run_id: str) -> RunState:
        return run_from(conn.execute(self.statements.run_get, {"p_id": run_id}).one())

    @_prepared
    def request_cancel(self, run_id: str) -> RunState:
        with self._engine.begin() as conn:
            run, now = self._locked_run(conn, run_id)
            if run.status.terminal or run.cancel_requested:
                return run
            conn.execute(self.statements.run_cancel, {"p_id": run_id, "p_now": now})
            return self._reread(conn, run_id)

    @_prepared
    def send_signal(self, run_id: str, name: str, payload: JSON) -> RunState:
        text = dumps(payload, f"signal {name!r}", "payload")
        st = self.statements
        with self._engine.begin() as conn:
            run, now = self._locked_run(conn, run_id)
            if run.status.terminal:
                raise RunSettledError(f"workflow run {run_id} is {run.status}; it takes no signals")
            # Every signal write holds the run lock, so check-then-insert is safe.
            sent = conn.execute(st.signal_payload, {"p_id": run_id, "p_name": name}).first()
            if sent is None:
                conn.execute(
                    st.signal_insert,
                    {"run_id": run_id, "name": name, "payload": text, "created_at": now},
                )
            else:
                check_resent(
                    run_id, name, read_stored(sent.payload, SIGNAL_PLACE, run_id, name), payload
                )
            conn.execute(st.run_touch, {"p_id": run_id, "p_now": now})
            return self._reread(conn, run_id)

    @_prepared
    def retry_run(self, run_id: str) -> RunState:
        with self._engine.begin() as conn:
            run, now = self._locked_run(conn, run_id)
            if run.status != RunStatus.FAILED:
                raise RunSettledError(
                    f"workflow run {run_id} is {run.status}; only a failed run can be retried"
                )
            conn.execute(self.statements.steps_reopen, {"p_id": run_id, "p_now": now})
            conn.execute(self.statements.run_reopen, {"p_id": run_id, "p_now": now})
            return self._reread(conn, run_id)

    # --- the audit trail ----------------------------------------------------
    @_prepared
    def record_action(
        self,
        run_id: str,
        action: AuditAction,
        operator: Operator,
        details: dict[str, JSON] | None = None,
    ) -> AuditEntry:
        text = dumps(details or {}, f"{action} of run {run_id}", "details")
        with self._engine.begin() as conn:
            now = int(conn.execute(self.statements.now).scalar_one())
            params = {
                "p_id": run_id,
                "p_action": AuditAction(action).value,
                "p_actor": operator.actor,
                "p_origin": operator.origin,
                "p_details": text,
                "p_now": now,
            }
            made = conn.execute(self.statements.audit_insert, params).inserted_primary_key
            assert made is not None  # an INSERT of one row names it
            entry_id = int(made[0])
        return AuditEntry(
            entry_id,
            run_id,
            AuditAction(action),
            operator.actor,
            operator.origin,
            json.loads(text),
            now,
        )

    @_prepared
    def audit_trail(self, run_id: str) -> list[AuditEntry]:
        with self._one() as conn:
            rows = conn.execute(self.statements.audit_of_run, {"p_id": run_id})
            return [audit_from(r) for r in rows]
