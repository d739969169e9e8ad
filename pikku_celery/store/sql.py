"""The workflow store on SQL (SQLAlchemy Core): the portable store, SQLite's as it is.

It behaves exactly as :class:`~pikku_celery.store.memory.InMemoryWorkflowStore`
(the reference); the conformance suite runs both. Statements are built once
per dialect and named (:mod:`.statements`). Ownership writes (claim,
complete, fail, refresh) are each guarded statements judged on the
database's clock, so whoever's write matched owns the attempt, whatever the
workers' clocks say. A pass reads, decides with no transaction open, then
writes under the run's row lock if no pass landed in between.

``SQLWorkflowStore(engine)`` builds the store for the engine's dialect:
:class:`~.sql_postgres.PostgresWorkflowStore` and
:class:`~.sql_mysql.MySQLWorkflowStore` override only what their database
does in fewer round trips. This class is the whole behaviour; SQLite runs it
as it is.

The store keeps no state between calls but the engine, so a dropped
connection costs one failed call (the pool replaces it), never a wedged store.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, ClassVar, Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa

from ..errors import (
    DuplicateStepError,
    RunNotFoundError,
    RunSettledError,
    SchemaMissingError,
    StoreError,
    StoreUnavailableError,
    WorkflowStepFunctionMismatchError,
    WorkflowStepSupersededError,
)
from ..payload import dumps, loads, read_stored
from ..retry import ROLLED_BACK
from ..sql.engines import READ_ONLY_OPTION, now_ms_expr
from ..sql.runner import Runner, SQLAlchemyRunner
from ..sql.transient import rolled_back
from .base import Decide, SettleWatch
from .changes import (
    eager_claim_of,
    new_claim_id,
    prepare_outcome,
    run_after_pass,
    run_created,
    step_created,
    step_created_claimed,
    step_parked_on_child,
    step_resolved,
    superseded,
)
from .kept_views import FirstPass
from .model import (
    BROKER,
    EAGER,
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Decision,
    Delivery,
    EagerClaim,
    ErrorInfo,
    NewRun,
    Operator,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)
from .rows import (
    SIGNAL_PLACE,
    attempt_from,
    attempt_params,
    audit_from,
    run_from,
    run_params,
    step_from,
    step_params,
    steps_from,
)
from .rules import (
    EncodedDecision,
    check_resent,
    child_outcome,
    encode_decision,
    lease_expired_error,
    run_cancelled_error,
)
from .schema import STORE_TABLES
from .statements import Statements

PASS_RACES = 50  # a pass overtaken this often in a row gives up (a wake-up retries it)
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


_Self = TypeVar("_Self", bound="SQLWorkflowStore")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _prepared(
    method: Callable[Concatenate[_Self, _P], _R],
) -> Callable[Concatenate[_Self, _P], _R]:
    """The store's first use, by any method, checks the schema (``prepare``)."""

    def call(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self._ready:
            self.prepare()
        return method(self, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


@functools.cache
def _portable_statements(dialect_name: str) -> Statements:
    return Statements(now_ms_expr(dialect_name))


class SQLWorkflowStore:
    """A :class:`~pikku_celery.store.base.WorkflowStore` on a SQLAlchemy engine.

    On PostgreSQL and MySQL/MariaDB the tables must exist (``pikku-celery db
    upgrade``); a missing table or column raises :class:`SchemaMissingError`
    on first use (:meth:`prepare`), before anything is written; building the
    store touches no database. For SQLite (the embedded default) the tables
    are created on first use unless ``create_tables=False``. Build
    SQLite engines with :func:`pikku_celery.sql.engines.make_engine`: its ``BEGIN
    IMMEDIATE`` is what serialises writers there.
    """

    creates_tables: ClassVar[bool] = True
    """Whether first use creates the tables (the embedded default does)."""

    def __new__(cls, engine: sa.Engine, **_: Any) -> SQLWorkflowStore:
        """The store for ``engine``'s dialect (see :func:`store_class_for`)."""
        chosen = store_class_for(engine) if cls is SQLWorkflowStore else cls
        return super().__new__(chosen)

    def __init__(
        self,
        engine: sa.Engine,
        *,
        create_tables: bool | None = None,
        upgrade_command: str | None = None,
        durable_claims: bool = False,
    ) -> None:
        self._engine = engine
        self.durable_claims = durable_claims
        """Whether a claim from a message waits for its commit to be durable
        (PostgreSQL commits it asynchronously otherwise; elsewhere it always waits)."""
        self.statements = self._make_statements()
        """Every statement this store runs, by name: ``statements.named()``."""
        self._single = self._single_statement_engine()
        self.runner: Runner = self._make_runner()
        """How a single statement runs (plain SQLAlchemy here)."""
        self._create_tables = self.creates_tables if create_tables is None else create_tables
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

    @contextmanager
    def _one(self) -> Iterator[sa.Connection]:
        """A connection for one statement: a short transaction (autocommit
        where the dialect's store says so)."""
        with self._single.begin() as conn:
            yield conn

    def sweep_statements(self) -> dict[str, sa.ClauseElement]:
        """The sweep queries, for EXPLAIN (tests, DBAs checking their plans)."""
        named = self.statements.named()
        return {
            "lapsed_steps": named["lapsed"],
            "undispatched_steps": named["undispatched"],
            "due_steps": named["due"],
            "idle_runs": named["idle"],
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
            self._created(run, len(text))
            return run, True
        except sa.exc.IntegrityError:
            if new.idempotency_key is not None:
                with self._one() as conn:
                    row = conn.execute(self.statements.run_by_key, key).first()
                if row is not None:  # a concurrent start with the same key won
                    return run_from(row), False
            raise StoreError(f"a workflow run with id {new.id!r} already exists") from None

    def _insert_run(
        self, new: NewRun, key: dict[str, Any], params: dict[str, Any]
    ) -> RunState | tuple[int, int]:
        """Insert the run; its (created_at, updated_at), or the run already
        started with that idempotency key."""
        st = self.statements
        with self._one() as conn:
            if new.idempotency_key is not None:
                row = conn.execute(st.run_by_key, key).first()
                if row is not None:
                    return run_from(row)
            now = int(conn.execute(st.now).scalar_one())
            conn.execute(st.run_insert, {**params, "created_at": now, "updated_at": now})
            return now, now

    def _created(self, run: RunState, input_size: int) -> None:
        """A run this thread just created (kept by stores whose first pass uses it)."""

    def _forget_created(self, run_id: str) -> None:
        """The run is about to change: a kept first view of it is stale."""

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
    ) -> list[RunState]:
        stmt = self.statements.list_runs(
            status is not None, workflow is not None, since is not None, until is not None
        )
        params = {
            "p_status": None if status is None else RunStatus(status).value,
            "p_workflow": workflow,
            "p_since": since,
            "p_until": until,
            "p_limit": limit,
            "p_offset": offset,
        }
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(stmt, params)]

    def _locked_run(self, conn: sa.Connection, run_id: str) -> tuple[RunState, int]:
        """Lock the run row for this transaction, then read the DB clock."""
        self._forget_created(run_id)
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

    # --- reads for people ----------------------------------------------------
    @_prepared
    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepState]]:
        found: dict[str, list[StepState]] = {}
        if not run_ids:
            return found
        with self._one() as conn:
            for row in conn.execute(self.statements.steps_of_runs, {"p_ids": list(run_ids)}):
                found.setdefault(row.run_id, []).append(step_from(row))
        return found

    @_prepared
    def count_runs_by_status(
        self,
        *,
        workflow: str | None = None,
        since: int | None = None,
        until: int | None = None,
    ) -> dict[RunStatus, int]:
        stmt = self.statements.count_runs(
            workflow is not None, since is not None, until is not None
        )
        params = {"p_workflow": workflow, "p_since": since, "p_until": until}
        counts = dict.fromkeys(RunStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(stmt, params):
                counts[RunStatus(status)] = int(n)
        return counts

    @_prepared
    def runs_with_key(self, idempotency_key: str, limit: int = 50) -> list[RunState]:
        params = {"p_key": idempotency_key, "p_limit": limit}
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(self.statements.runs_with_key, params)]

    @_prepared
    def get_signals(self, run_id: str) -> dict[str, JSON]:
        with self._one() as conn:
            rows = conn.execute(self.statements.signals_in_order, {"p_id": run_id})
            return {name: read_stored(text, SIGNAL_PLACE, run_id, name) for name, text in rows}

    @_prepared
    def count_steps_by_status(self) -> dict[StepStatus, int]:
        counts = dict.fromkeys(StepStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(self.statements.steps_by_status):
                counts[StepStatus(status)] = int(n)
        return counts

    @_prepared
    def count_attempts_by_status(self) -> dict[AttemptStatus, int]:
        counts = dict.fromkeys(AttemptStatus, 0)
        with self._one() as conn:
            for status, n in conn.execute(self.statements.attempts_by_status):
                counts[AttemptStatus(status)] = int(n)
        return counts

    @_prepared
    def in_flight_views(self, after_id: str | None = None, limit: int = 500) -> list[RunView]:
        st = self.statements
        # One read-only transaction: one snapshot where the database gives
        # one per transaction (SQLite, MySQL), and no write lock on SQLite.
        reader = self._engine.execution_options(**{READ_ONLY_OPTION: True})
        with reader.begin() as conn:
            now = int(conn.execute(st.now).scalar_one())
            params = {"p_after": after_id or "", "p_limit": limit}
            runs = [run_from(r) for r in conn.execute(st.in_flight_runs, params)]
            if not runs:
                return []
            ids = {"p_ids": [r.id for r in runs]}
            steps: dict[str, list[StepState]] = {r.id: [] for r in runs}
            for step in steps_from(conn.execute(st.steps_of_runs, ids)):
                steps[step.run_id].append(step)
            signals: dict[str, dict[str, JSON]] = {r.id: {} for r in runs}
            for run_id, name, text in conn.execute(st.signals_of_runs, ids):
                signals[run_id][name] = read_stored(text, SIGNAL_PLACE, run_id, name)
        return [RunView(run=r, steps=steps[r.id], signals=signals[r.id], now=now) for r in runs]

    # --- steps ---------------------------------------------------------------
    @_prepared
    def get_steps(self, run_id: str) -> list[StepState]:
        with self._one() as conn:
            return [
                step_from(r) for r in conn.execute(self.statements.steps_of_run, {"p_id": run_id})
            ]

    @_prepared
    def get_step(self, step_id: str) -> StepState | None:
        """The step, or None if there is no step with that id."""
        with self._one() as conn:
            row = conn.execute(self.statements.step_get, {"p_id": step_id}).first()
        return None if row is None else step_from(row)

    @_prepared
    def get_attempts(self, run_id: str) -> list[AttemptState]:
        with self._one() as conn:
            rows = conn.execute(self.statements.attempts_of_run, {"p_id": run_id})
            return [attempt_from(r) for r in rows]

    @_prepared
    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
        bound_ms: int | None = None,
        delivery: Delivery | None = None,
    ) -> StepState | None:
        params = {
            "p_id": step_id,
            "p_run": run_id,
            "p_task": task_name,
            "p_worker": worker,
            "p_lease_ms": lease_ms,
            "p_bound_ms": bound_ms,
            "p_claim": new_claim_id(),
            "p_task_id": None if delivery is None else delivery.task_id,
            "p_node": None if delivery is None else delivery.node,
        }
        return self._claim(params)

    def _claim(self, params: dict[str, Any]) -> StepState | None:
        """The guarded claim, then the step read back and its attempt row
        written, in one transaction."""
        st = self.statements
        with self._one() as conn:
            claimed = conn.execute(st.claim, params).rowcount == 1
            row = conn.execute(st.step_get, {"p_id": params["p_id"]}).first() if claimed else None
            if row is None:
                self._refuse_other_task(conn, params)
                return None
            step = step_from(row)
            conn.execute(
                st.attempt_insert,
                {
                    "step_id": step.id,
                    "attempt": step.attempt,
                    "run_id": step.run_id,
                    "status": AttemptStatus.RUNNING.value,
                    "worker": params["p_worker"],
                    "started_at": step.updated_at,
                    "claim_id": step.claim_id,
                    "dispatch": BROKER,
                    "task_id": params["p_task_id"],
                    "node": params["p_node"],
                },
            )
            if step.attempt > 1:
                conn.execute(st.supersede, {"p_id": step.id, "p_attempt": step.attempt - 1})
            return step

    def _refuse_other_task(self, conn: sa.Connection, params: dict[str, Any]) -> None:
        """Nothing claimed: say so if the step was recorded with another task (rule 6)."""
        step_id, run_id, task_name = params["p_id"], params["p_run"], params["p_task"]
        recorded = conn.execute(self.statements.step_task_name, {"p_id": step_id}).first()
        if (
            recorded is not None
            and run_id in (None, recorded.run_id)
            and recorded.task_name != task_name
        ):
            raise WorkflowStepFunctionMismatchError(step_id, recorded.task_name, task_name)

    @_prepared
    def refresh_step_lease(
        self, step_id: str, attempt: int, lease_ms: int | None, claim_id: str | None = None
    ) -> bool:
        params = {
            "p_id": step_id,
            "p_attempt": attempt,
            "p_lease_ms": lease_ms,
            "p_claim": claim_id,
        }
        with self._one() as conn:
            if lease_ms is None:
                return conn.execute(self.statements.park, params).rowcount == 1
            return self._renew(conn, params)

    def _renew(self, conn: sa.Connection, params: dict[str, Any]) -> bool:
        """Renew the lease and count it on the attempt row; False if refused.
        Here (SQLite) two statements in the transaction; PostgreSQL and
        MySQL write both rows in one."""
        if conn.execute(self.statements.renew, params).rowcount != 1:
            return False
        conn.execute(self.statements.renew_counted, params)
        return True

    def _fenced_write(
        self, conn: sa.Connection, kind: str, params: dict[str, Any], on_pass_clock: bool = False
    ) -> bool:
        """Run the fenced outcome ``kind`` (on the pass's 'now' when
        ``on_pass_clock``); False, nothing written, if superseded."""
        st = self.statements
        steps, attempts = (
            (st.fenced_at_step, st.fenced_at_attempt)
            if on_pass_clock
            else (st.fenced_step, st.fenced_attempt)
        )
        if conn.execute(steps[kind], params).rowcount != 1:
            return False
        conn.execute(attempts[kind], params)
        return True

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        """A standalone fenced outcome, in its own transaction."""
        with self._engine.begin() as conn:
            return self._fenced_write(conn, kind, params)

    @_prepared
    def complete_step(
        self, step_id: str, attempt: int, result: JSON, claim_id: str | None = None
    ) -> None:
        text = dumps(result, f"step {step_id}", "result")
        params = {"p_id": step_id, "p_attempt": attempt, "p_result": text, "p_claim": claim_id}
        if not self._fenced_outcome("complete", params):
            raise self._superseded(step_id, attempt, claim_id)

    def _superseded(
        self, step_id: str, attempt: int, claim_id: str | None
    ) -> WorkflowStepSupersededError:
        """The refusal of a fenced write, saying whether only its claim differed."""
        step = self.get_step(step_id) if claim_id is not None else None
        return superseded(step_id, step, attempt, claim_id)

    @_prepared
    def complete_in_transaction(
        self,
        step_id: str,
        attempt: int,
        body: Callable[[sa.Connection], JSON],
        claim_id: str | None = None,
    ) -> JSON:
        """Run ``body`` and the fenced success write in ONE transaction.

        The body's own writes on the connection commit together with the
        step's outcome, or not at all: an exception in the body, a result that
        is not JSON, or a superseded attempt (:class:`WorkflowStepSupersededError`)
        rolls everything back.
        """
        with self._engine.begin() as conn:
            result = body(conn)
            params = {
                "p_id": step_id,
                "p_attempt": attempt,
                "p_result": dumps(result, f"step {step_id}", "result"),
                "p_claim": claim_id,
            }
            if not self._fenced_write(conn, "complete", params):
                # Raised inside: the body's writes roll back with the refusal.
                raise self._superseded(step_id, attempt, claim_id)
        return result

    @_prepared
    def fail_step(
        self,
        step_id: str,
        attempt: int,
        error: ErrorInfo,
        retry_delay: float | None = None,
        claim_id: str | None = None,
    ) -> None:
        text = dumps(error, f"step {step_id}", "error")
        params = {
            "p_id": step_id,
            "p_attempt": attempt,
            "p_error": text,
            "p_delay_ms": None if retry_delay is None else round(retry_delay * 1000),
            "p_claim": claim_id,
        }
        if not self._fenced_outcome("fail" if retry_delay is None else "fail_retry", params):
            raise self._superseded(step_id, attempt, claim_id)

    @_prepared
    def expire_step(self, step_id: str, bound_ms: int | None = None) -> bool:
        st = self.statements
        with self._engine.begin() as conn:
            row = conn.execute(st.step_get, {"p_id": step_id}).first()
            if row is None:
                return False
            step = step_from(row)
            err = json.dumps(lease_expired_error(step.name, step.attempt))
            params = {
                "p_id": step_id,
                "p_attempt": step.attempt,
                "p_error": err,
                "p_bound_ms": bound_ms,
            }
            if conn.execute(st.expire, params).rowcount != 1:
                return False
            conn.execute(st.expire_attempt, params)
            return True

    @_prepared
    def mark_scheduled(self, step_ids: Sequence[str]) -> None:
        if not step_ids:
            return
        with self._one() as conn:
            conn.execute(self.statements.mark_scheduled, {"p_ids": list(step_ids)})

    # --- the orchestration pass ---------------------------------------------
    @_prepared
    def advance(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        """One pass, atomic and serialised per run.

        A deadlock (a child run ending while its parent cancels it, each
        holding its own run row) rolls back and retries the whole pass
        (:data:`pikku_celery.retry.ROLLED_BACK`). So
        ``decide`` may be called more than once and must be a pure function
        of the view (the replay is). A value the database refuses (a
        ``DataError`` or ``IntegrityError``) is raised as :class:`StoreError`.
        """
        try:
            return ROLLED_BACK.call(lambda: self._pass(run_id, outcome, decide), rolled_back)
        except (sa.exc.DataError, sa.exc.IntegrityError) as exc:
            # A value the database will not take: the same on every replay,
            # so a store error (the engine then fails the run).
            first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else ""
            raise StoreError(
                f"the database refused what the pass of run {run_id} decided: {first_line}"
            ) from exc

    def _pass(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        """One try of the pass (the locked pass here)."""
        return self._advance(run_id, outcome, decide)

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[SettleWatch | None]:
        """None: this store sends no settle notifications (waiters poll)."""
        yield None

    def _advance(
        self,
        run_id: str,
        outcome: StepOutcome | None,
        decide: Decide,
        first: FirstPass | None = None,
    ) -> AdvanceResult:
        """The general pass: read, decide with no transaction open, then write
        under the run's row lock if no pass landed in between (else again).

        ``decide`` runs the user's body: holding a lock or a transaction over
        it would let one slow body stall ``runs cancel`` and every other
        writer of the run.
        """
        st = self.statements
        for _ in range(PASS_RACES):
            with self._one() as conn:
                row = conn.execute(st.run_get, {"p_id": run_id}).first()
                if row is None:
                    raise RunNotFoundError(f"no workflow run {run_id!r}")
                run = run_from(row)
                if run.status.terminal and outcome is None:
                    return AdvanceResult(run=run, steps=[], decision=None)
                rows = conn.execute(st.pass_read, {"p_id": run_id}).all()
                signals: dict[str, JSON] = {}
                if rows[0].has_signals:
                    for name, payload in conn.execute(st.signals_of_run, {"p_id": run_id}):
                        signals[name] = read_stored(payload, SIGNAL_PLACE, run_id, name)
            now = int(rows[0].db_now)
            steps = [step_from(r) for r in rows if r.id is not None]
            prepared = None if outcome is None else prepare_outcome(steps, outcome, now)
            if prepared is not None:
                steps = prepared.steps
            decision = None
            if not run.status.terminal:
                reused = None if first is None else first.reused(run, steps, signals)
                if reused is not None:
                    view, decision = reused  # the run as created, and its clock
                else:
                    view = RunView(run=run, steps=steps, signals=signals, now=now)
                    decision = decide(view)
            with self._engine.begin() as conn:
                self._forget_created(run_id)
                version = conn.execute(st.run_version_lock, {"p_id": run_id}).scalar()
                if version != run.version:
                    continue  # another pass or a signal landed: read and decide again
                if prepared is not None:
                    assert outcome is not None
                    written = self._fenced_write(
                        conn, prepared.kind, prepared.params, on_pass_clock=True
                    )
                    if not written:
                        raise superseded(outcome.step_id, None, outcome.attempt, outcome.claim_id)
                if decision is None:
                    return AdvanceResult(run=run, steps=[], decision=None)
                return self._apply_decision(conn, run, view, decision)
        raise StoreError(
            f"workflow run {run_id}: {PASS_RACES} passes in a row were overtaken by others; "
            "the pass is left to the next wake-up"
        )

    def _apply_decision(
        self, conn: sa.Connection, run: RunState, view: RunView, decision: Decision
    ) -> AdvanceResult:
        st = self.statements
        encoded = encode_decision(run, {s.id: s.name for s in view.steps}, decision)
        now = view.now
        by_id = {s.id: s for s in view.steps}
        publish: list[StepState] = []

        resolved: list[dict[str, Any]] = []
        child_attempts: list[dict[str, Any]] = []
        for enc in encoded.resolutions:
            res = enc.resolution
            step = by_id[res.step_id]
            if step.settled:
                continue
            status = StepStatus.SUCCEEDED if res.ok else StepStatus.FAILED
            resolved.append(
                {
                    "p_id": step.id,
                    "p_status": status.value,
                    "p_result": enc.result,
                    "p_error": enc.error,
                    "p_now": now,
                }
            )
            by_id[step.id] = step_resolved(step, res.ok, loads(enc.result), loads(enc.error), now)
            if step.kind == StepKind.CHILD:
                child_attempts.append(
                    {
                        "p_id": step.id,
                        "p_attempt": step.attempt,
                        "p_status": (
                            AttemptStatus.SUCCEEDED if res.ok else AttemptStatus.FAILED
                        ).value,
                        "p_result": enc.result,
                        "p_error": enc.error,
                        "p_now": now,
                    }
                )
        if resolved:
            conn.execute(st.resolve, resolved)
        if child_attempts:
            conn.execute(st.resolve_attempt, child_attempts)

        children, eager = self._insert_steps(conn, run, encoded, decision.eager, now, publish)

        if decision.redispatch:
            conn.execute(st.redispatch, {"p_ids": list(decision.redispatch), "p_now": now})
            for sid in decision.redispatch:
                by_id[sid] = replace(by_id[sid], scheduled_at=now)
                publish.append(by_id[sid])
        for child_id in decision.cancel_children:
            if conn.execute(st.cancel_child, {"p_id": child_id, "p_now": now}).rowcount == 1:
                children.append(child_id)

        parent_to_wake = None
        ends = decision.run_status is not None and decision.run_status.terminal
        if decision.run_status == RunStatus.CANCELLED:
            closed = {"p_id": run.id, "p_now": now, "p_error": json.dumps(run_cancelled_error())}
            conn.execute(st.close_live_steps, closed)
            conn.execute(st.close_live_attempts, closed)
        new_run = run_after_pass(run, decision, loads(encoded.output), loads(encoded.error), now)
        if ends:
            assert decision.run_status is not None
            conn.execute(
                st.run_end,
                {
                    "p_id": run.id,
                    "p_now": now,
                    "p_status": decision.run_status.value,
                    "p_output": encoded.output,
                    "p_error": encoded.error,
                },
            )
            parent_to_wake = self._settle_parent_step(conn, new_run, decision, now)
        else:
            conn.execute(st.run_pass, {"p_id": run.id, "p_now": now, "p_wake_at": decision.wake_at})
        return AdvanceResult(
            run=new_run,
            steps=publish,
            decision=decision,
            parent_to_wake=parent_to_wake,
            children_to_wake=children,
            eager=eager,
        )

    def _insert_steps(
        self,
        conn: sa.Connection,
        run: RunState,
        encoded: EncodedDecision,
        eager_claim: EagerClaim | None,
        now: int,
        publish: list[StepState],
    ) -> tuple[list[str], StepState | None]:
        """Insert the pass's new steps (and child runs), batched per table;
        the step ``eager_claim`` names is written claimed, and returned."""
        if not encoded.steps:
            return [], None
        steps: list[dict[str, Any]] = []
        child_runs: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        children: list[str] = []
        eager = None
        for enc in encoded.steps:
            new = enc.new
            step = step_created(run, enc, now)
            claim = eager_claim_of(eager_claim, new)
            if claim is not None:
                step = eager = step_created_claimed(step, claim, now)
                attempts.append(
                    attempt_params(step, AttemptStatus.RUNNING, EAGER, now, claim.delivery)
                )
            elif (
                new.kind != StepKind.VALUE and new.child is not None and enc.child_input is not None
            ):
                child = replace(
                    new.child, parent_run_id=run.id, parent_step_id=enc.id, depth=run.depth + 1
                )
                child_runs.append(
                    {**run_params(child, enc.child_input), "created_at": now, "updated_at": now}
                )
                step = step_parked_on_child(step, child.id)
                attempts.append(attempt_params(step, AttemptStatus.RUNNING, None, now))
                children.append(child.id)
            steps.append(step_params(step, enc.args, enc.kwargs, enc.value))
            if step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
                publish.append(step)
        if child_runs:
            conn.execute(self.statements.run_insert, child_runs)
        try:
            conn.execute(self.statements.step_insert, steps)
        except sa.exc.IntegrityError as exc:
            raise DuplicateStepError(
                f"workflow run {run.id} already has one of the steps "
                f"{[e.new.name for e in encoded.steps]!r}"
            ) from exc
        if attempts:
            conn.execute(self.statements.attempt_insert, attempts)
        return children, eager

    def _settle_parent_step(
        self, conn: sa.Connection, run: RunState, decision: Decision, now: int
    ) -> str | None:
        """The ended child run settles its parent's parked step (rules.child_outcome)."""
        if run.parent_run_id is None or run.parent_step_id is None:
            return None
        st = self.statements
        ok, result, error = child_outcome(
            run.id, replace(decision, output=run.output, error=run.error)
        )
        params = {
            "p_id": run.parent_step_id,
            "p_parent": run.parent_run_id,
            "p_child": run.id,
            "p_status": (StepStatus.SUCCEEDED if ok else StepStatus.FAILED).value,
            "p_result": json.dumps(result) if ok else None,
            "p_error": None if error is None else json.dumps(error),
            "p_now": now,
        }
        if conn.execute(st.settle_parent_step, params).rowcount != 1:
            return None
        attempt_status = (AttemptStatus.SUCCEEDED if ok else AttemptStatus.FAILED).value
        conn.execute(st.settle_parent_attempt, {**params, "p_status": attempt_status})
        conn.execute(st.touch_parent, {"p_id": run.parent_run_id, "p_now": now})
        return run.parent_run_id

    # --- sweep ---------------------------------------------------------------
    @_prepared
    def lapsed_steps(self, limit: int, bound_ms: int | None = None) -> list[StepState]:
        params = {"p_limit": limit, "p_bound_ms": bound_ms}
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.lapsed, params)]

    @_prepared
    def undispatched_steps(self, older_than_ms: int, limit: int) -> list[StepState]:
        params = {"p_older_ms": older_than_ms, "p_limit": limit}
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.undispatched, params)]

    @_prepared
    def due_steps(self, limit: int) -> list[StepState]:
        with self._one() as conn:
            return [step_from(r) for r in conn.execute(self.statements.due, {"p_limit": limit})]

    @_prepared
    def idle_runs(self, idle_ms: int, limit: int) -> list[RunState]:
        params = {"p_idle_ms": idle_ms, "p_limit": limit}
        with self._one() as conn:
            return [run_from(r) for r in conn.execute(self.statements.idle, params)]

    @_prepared
    def mark_blocked(self, run_id: str, reason: str) -> None:
        with self._one() as conn:
            conn.execute(self.statements.mark_blocked, {"p_id": run_id, "p_reason": reason})

    @_prepared
    def waiting_by_queue(self, older_than_ms: int) -> list[tuple[str | None, int, int]]:
        with self._one() as conn:
            rows = conn.execute(self.statements.waiting_by_queue, {"p_older_ms": older_than_ms})
            return [(r.queue, int(r.steps), int(r.oldest_ms)) for r in rows]

    @_prepared
    def note_swept(self, run_id: str, backoff_ms: int, max_backoff_ms: int | None = None) -> bool:
        params = {
            "p_id": run_id,
            "p_backoff_ms": backoff_ms,
            "p_max_backoff_ms": backoff_ms if max_backoff_ms is None else max_backoff_ms,
        }
        with self._one() as conn:
            return conn.execute(self.statements.note_swept, params).rowcount == 1

    @_prepared
    def note_steps_swept(
        self, step_ids: Sequence[str], backoff_ms: int, max_backoff_ms: int | None = None
    ) -> None:
        if not step_ids:
            return
        params = {
            "p_ids": list(step_ids),
            "p_backoff_ms": backoff_ms,
            "p_max_backoff_ms": backoff_ms if max_backoff_ms is None else max_backoff_ms,
        }
        with self._one() as conn:
            conn.execute(self.statements.note_steps_swept, params)


def store_class_for(engine: sa.Engine) -> type[SQLWorkflowStore]:
    """The store class for ``engine``'s database: the one place a dialect is chosen."""
    name = engine.dialect.name
    if name == "postgresql":
        from .sql_postgres import PostgresWorkflowStore

        return PostgresWorkflowStore
    if name in ("mysql", "mariadb"):
        from .sql_mysql import MySQLWorkflowStore

        return MySQLWorkflowStore
    if name == "sqlite":
        return SQLWorkflowStore
    raise ValueError(f"unsupported database dialect for the workflow store: {name}")
