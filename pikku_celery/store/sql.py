"""The workflow store on SQL (SQLAlchemy Core): SQLite, PostgreSQL, MySQL/MariaDB.

It behaves exactly as :class:`~pikku_celery.store.memory.InMemoryWorkflowStore`
(the reference); the conformance suite runs both. Statements are built once
per dialect (:mod:`.statements`). Ownership writes (claim, complete, fail,
refresh) are each one guarded statement judged on the database's clock, so
whoever's write matched owns the attempt, whatever the workers' clocks say.

On PostgreSQL a claim or a completion, attempt row included, is one
data-modifying CTE in autocommit: one round trip. A pass with an outcome
(:meth:`SQLWorkflowStore.advance`, the engine's hot path) is one unlocked read
and one version-checked statement; anything else takes the locked pass, one
transaction with the run row locked. MySQL/MariaDB have no ``UPDATE ...
RETURNING``: there a claim is a short transaction that reads the row back.

The store keeps no state between calls but the engine, so a dropped
connection costs one failed call (the pool replaces it), never a wedged store.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

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
from .base import Decide
from .batch import Batch, run_batch, takes_batches
from .model import (
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    Decision,
    ErrorInfo,
    NewRun,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)
from .rules import (
    EncodedDecision,
    EncodedStep,
    child_outcome,
    encode_decision,
    lease_expired_error,
    run_cancelled_error,
    step_after_outcome,
)
from .schema import STORE_TABLES, step_table
from .settle import SETTLED_CHANNEL, SettleListener
from .statements import CLAIM_VIEW_STEPS, Fenced, dialect_of, statements

if TYPE_CHECKING:
    from ..libpq import PgStatement

DEADLOCK_RETRIES = 5
PASS_RACES = 50  # a pass overtaken this often in a row gives up (a wake-up retries it)
_STEP_COLUMNS = tuple(c.name for c in step_table.c)
# The columns of MySQL's packed claim read back (statements.mysql_claim_batch).
_PACKED_CLAIM = (*_STEP_COLUMNS, "claimed_here")
NOTIFY_SETTLED = sa.text("SELECT pg_notify(:channel, :run_id)")
UPGRADE_COMMAND = "pikku-celery db upgrade --database-url {url}"

# --- rows -> values ----------------------------------------------------------
# Where a stored value that is not JSON sits (payload.read_stored formats it
# only for such a value).
_RUN_COLUMN = "run {} column {}"
_STEP_COLUMN = "run {} step {!r} column {}"
_ATTEMPT_COLUMN = "attempt {} of step {} column {}"


def _run_from(row: Any, prefix: str = "") -> RunState:
    m = row._mapping
    p = prefix
    run_id = m[p + "id"]
    return RunState(
        id=run_id,
        workflow=m[p + "workflow"],
        status=RunStatus(m[p + "status"]),
        input=read_stored(m[p + "input"], _RUN_COLUMN, run_id, "input"),
        output=read_stored(m[p + "output"], _RUN_COLUMN, run_id, "output"),
        error=read_stored(m[p + "error"], _RUN_COLUMN, run_id, "error"),
        idempotency_key=m[p + "idempotency_key"],
        parent_run_id=m[p + "parent_run_id"],
        parent_step_id=m[p + "parent_step_id"],
        cancel_requested=bool(m[p + "cancel_requested"]),
        version=m[p + "version"],
        wake_at=m[p + "wake_at"],
        next_sweep_at=m[p + "next_sweep_at"],
        sweep_count=m[p + "sweep_count"],
        created_at=m[p + "created_at"],
        updated_at=m[p + "updated_at"],
        depth=m[p + "depth"],
        blocked=m[p + "blocked"],
    )


def _step_from(row: Any) -> StepState:
    run_id, name = row.run_id, row.name
    args = read_stored(row.args, _STEP_COLUMN, run_id, name, "args")
    kwargs = read_stored(row.kwargs, _STEP_COLUMN, run_id, name, "kwargs")
    return StepState(
        id=row.id,
        run_id=row.run_id,
        name=row.name,
        seq=row.seq,
        kind=StepKind(row.kind),
        status=StepStatus(row.status),
        task_name=row.task_name,
        queue=row.queue,
        args=[] if args is None else args,
        kwargs={} if kwargs is None else kwargs,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        retry_delay=row.retry_delay,
        backoff=row.backoff,
        lease_expires_at=row.lease_expires_at,
        wake_at=row.wake_at,
        child_run_id=row.child_run_id,
        result=read_stored(row.result, _STEP_COLUMN, run_id, name, "result"),
        error=read_stored(row.error, _STEP_COLUMN, run_id, name, "error"),
        worker=row.worker,
        scheduled_at=row.scheduled_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        route=read_stored(row.route, _STEP_COLUMN, run_id, name, "route"),
    )


def _attempt_from(row: Any) -> AttemptState:
    place = (row.attempt, row.step_id)
    return AttemptState(
        step_id=row.step_id,
        attempt=row.attempt,
        status=AttemptStatus(row.status),
        worker=row.worker,
        result=read_stored(row.result, _ATTEMPT_COLUMN, *place, "result"),
        error=read_stored(row.error, _ATTEMPT_COLUMN, *place, "error"),
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _step_params(step: StepState, args: str, kwargs: str, result: str | None) -> dict[str, Any]:
    return {
        "id": step.id,
        "run_id": step.run_id,
        "name": step.name,
        "seq": step.seq,
        "kind": step.kind.value,
        "status": step.status.value,
        "task_name": step.task_name,
        "queue": step.queue,
        "args": args,
        "kwargs": kwargs,
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "retry_delay": float(step.retry_delay),
        "backoff": float(step.backoff),
        "lease_expires_at": step.lease_expires_at,
        "wake_at": step.wake_at,
        "child_run_id": step.child_run_id,
        "result": result,
        "error": None,
        "worker": step.worker,
        "scheduled_at": step.scheduled_at,
        "created_at": step.created_at,
        "updated_at": step.updated_at,
        "route": None if step.route is None else json.dumps(step.route, separators=(",", ":")),
    }


def _run_params(new: NewRun, input_text: str) -> dict[str, Any]:
    return {
        "id": new.id,
        "workflow": new.workflow,
        "status": RunStatus.RUNNING.value,
        "input": input_text,
        "output": None,
        "error": None,
        "idempotency_key": new.idempotency_key,
        "parent_run_id": new.parent_run_id,
        "parent_step_id": new.parent_step_id,
        "cancel_requested": False,
        "version": 1,
        "wake_at": None,
        "next_sweep_at": None,
        "sweep_count": 0,
        "depth": new.depth,
        "blocked": None,
    }


def _new_run_state(new: NewRun, input_text: str, now: int) -> RunState:
    return RunState(
        id=new.id,
        workflow=new.workflow,
        status=RunStatus.RUNNING,
        input=json.loads(input_text),
        idempotency_key=new.idempotency_key,
        parent_run_id=new.parent_run_id,
        parent_step_id=new.parent_step_id,
        version=1,
        created_at=now,
        updated_at=now,
        depth=new.depth,
    )


@dataclass(frozen=True)
class _PreparedOutcome:
    kind: str  # one of OUTCOMES
    params: dict[str, Any]  # binds of the fenced write
    steps: list[StepState]  # the run's steps as they are once it lands


def _prepare_outcome(steps: list[StepState], outcome: StepOutcome, now: int) -> _PreparedOutcome:
    """Check the fence against the steps read and serialise the payload,
    before anything is written (the write itself is fenced again)."""
    index = next((i for i, s in enumerate(steps) if s.id == outcome.step_id), None)
    step = None if index is None else steps[index]
    if step is not None and (step.status != StepStatus.RUNNING or step.attempt != outcome.attempt):
        raise WorkflowStepSupersededError(outcome.step_id, outcome.attempt)
    where = f"step {step.name!r}" if step is not None else f"step {outcome.step_id}"
    params: dict[str, Any] = {"p_id": outcome.step_id, "p_attempt": outcome.attempt, "p_now": now}
    if outcome.ok:
        params["p_result"] = text = dumps(outcome.result, where, "result")
        kind = "complete"
    else:
        params["p_error"] = text = dumps(outcome.error, where, "error")
        retry = outcome.retry_delay
        params["p_delay_ms"] = None if retry is None else round(retry * 1000)
        kind = "fail" if retry is None else "fail_retry"
    if step is None or index is None:
        return _PreparedOutcome(kind, params, steps)
    # The step as the write leaves it, with the payload as it will read back.
    stored = (
        replace(outcome, result=json.loads(text))
        if outcome.ok
        else replace(outcome, error=json.loads(text))
    )
    done = step_after_outcome(step, stored, now)
    return _PreparedOutcome(kind, params, [*steps[:index], done, *steps[index + 1 :]])


def _new_step_state(run: RunState, enc: EncodedStep, now: int) -> StepState:
    """A new step as the pass records it (before any child-run parking)."""
    new = enc.new
    step = StepState(
        id=enc.id,
        run_id=run.id,
        name=new.name,
        seq=new.seq,
        kind=new.kind,
        status=new.status,
        task_name=new.task_name,
        queue=new.queue,
        args=json.loads(enc.args),
        kwargs=json.loads(enc.kwargs),
        max_attempts=new.max_attempts,
        retry_delay=new.retry_delay,
        backoff=new.backoff,
        wake_at=new.wake_at,
        scheduled_at=now if new.status == StepStatus.SCHEDULED else None,
        created_at=now,
        updated_at=now,
        route=new.route,
    )
    if new.kind == StepKind.VALUE or new.status == StepStatus.SUCCEEDED:
        step = replace(step, status=StepStatus.SUCCEEDED, result=loads(enc.value))
    return step


class _FirstPass:
    """A new run's first pass, decided on the run as created. If the locked
    pass takes over (the decision is more than the optimistic statement
    writes) and finds the run untouched, it applies that same view and
    decision instead of deciding again."""

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self.made: tuple[RunView, Decision] | None = None

    def decide(self, view: RunView) -> Decision:
        decision = self._decide(view)
        self.made = (view, decision)
        return decision

    def reused(
        self, run: RunState, steps: list[StepState], signals: dict[str, JSON]
    ) -> tuple[RunView, Decision] | None:
        """The view and decision made, if the locked pass found the run as it was."""
        made = self.made
        if made is not None and run == made[0].run and not steps and not signals:
            return made
        return None


def _is_deadlock(exc: sa.exc.DBAPIError) -> bool:
    """A deadlock or serialisation failure: the whole pass may be retried."""
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in ("40P01", "40001"):
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] == 1213  # MySQL ER_LOCK_DEADLOCK


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


CLAIM_VIEWS_KEPT = 1024
CLAIM_VIEW_MARGIN_MS = 250
FRESH_RUN_MS = 10_000  # a new run's first pass skips its read within this long


def _remember(views: OrderedDict[Any, Any], key: Any, view: Any) -> None:
    """Keep ``view`` for its pass; the oldest goes once CLAIM_VIEWS_KEPT are
    kept (bodies that never came back, runs created but never advanced)."""
    if len(views) >= CLAIM_VIEWS_KEPT:
        # popitem, not pop(next(iter(...))): a threads pool shares the store,
        # and another thread's change would break the iteration.
        with contextlib.suppress(KeyError):
            views.popitem(last=False)
    views[key] = view


@dataclass(frozen=True)
class _ClaimView:
    """The run as a PostgreSQL claim read it, for that attempt's pass."""

    run: RunState
    steps: list[StepState]
    db_now: int
    has_signals: bool
    read_at: float  # time.monotonic() of the claim
    lease_expires_at: int  # of the claimed attempt, as granted
    input_size: int  # of the run's input as stored (its JSON text's length)

    def now(self) -> int:
        return self.db_now + int((time.monotonic() - self.read_at) * 1000)

    def still_ours(self, run_id: str) -> bool:
        """Usable while the claim's first lease is surely live: until then no
        other attempt can have taken the step, so the view's fence holds."""
        return self.run.id == run_id and self.now() + CLAIM_VIEW_MARGIN_MS < self.lease_expires_at


@dataclass(frozen=True)
class _Passed:
    """A run's steps as an optimistic pass of this store wrote them."""

    run: RunState  # the run as that pass left it (its version, its input)
    steps: list[StepState]
    input_size: int  # of the run's input as stored (its JSON text's length)


PASSED_KEPT = 256
PASSED_INPUT_BYTES = 32 * 1024 * 1024


class _PassedRuns:
    """The runs this store's optimistic passes left, by the step each scheduled.

    An entry is taken by that step's claim, when it lands in this process; in
    a prefork pool about half land in another, and theirs stay until pushed
    out. So the oldest go once PASSED_KEPT are kept, or once the inputs they
    hold (up to max_input_bytes each) pass PASSED_INPUT_BYTES.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[str, _Passed] = OrderedDict()
        self._input_bytes = 0
        self._lock = threading.Lock()  # a threads pool shares the store

    def put(self, step_id: str, passed: _Passed) -> None:
        with self._lock:
            old = self._kept.pop(step_id, None)
            if old is not None:
                self._input_bytes -= old.input_size
            self._kept[step_id] = passed
            self._input_bytes += passed.input_size
            while len(self._kept) > PASSED_KEPT or (
                self._input_bytes > PASSED_INPUT_BYTES and len(self._kept) > 1
            ):
                _, dropped = self._kept.popitem(last=False)
                self._input_bytes -= dropped.input_size

    def take(self, step_id: str) -> _Passed | None:
        with self._lock:
            passed = self._kept.pop(step_id, None)
            if passed is not None:
                self._input_bytes -= passed.input_size
            return passed


class _Row:
    """A fast-path row: attribute access and ``_mapping``, as SQLAlchemy's rows have."""

    __slots__ = ("_mapping",)

    def __init__(self, mapping: dict[str, Any]) -> None:
        self._mapping = mapping

    def __getattr__(self, name: str) -> Any:
        try:
            return self._mapping[name]
        except KeyError:
            raise AttributeError(name) from None


class _Direct:
    """The store's single statements compiled once each for libpq
    (:mod:`pikku_celery.libpq`), on PostgreSQL through psycopg: the claim,
    the optimistic pass, a run's insert and read, the settle NOTIFY."""

    def __init__(self, engine: sa.Engine) -> None:
        # Imported here: psycopg is loaded only by stores that use it.
        from ..libpq import PgStatement, run_pooled

        self._engine = engine
        self._compile = PgStatement.compile
        self._run = run_pooled
        # By the statement's identity: the store's statements are built once.
        self._compiled: dict[int, tuple[Any, PgStatement]] = {}

    def rows(self, stmt: Any, params: dict[str, Any]) -> list[_Row] | None:
        """The statement's rows, or None when this call must take the general path."""
        found = self._compiled.get(id(stmt))
        if found is None or found[0] is not stmt:
            found = self._compiled[id(stmt)] = (stmt, self._compile(stmt, self._engine.dialect))
        compiled = found[1]
        rows = self._run(self._engine, compiled, params)
        if rows is None:
            return None
        names = compiled.columns  # the result's, kept on the statement by its first run
        assert names is not None
        return [_Row(dict(zip(names, values, strict=True))) for values in rows]


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


class SQLWorkflowStore:
    """A :class:`~pikku_celery.store.base.WorkflowStore` on a SQLAlchemy engine.

    On PostgreSQL and MySQL/MariaDB the tables must exist (``pikku-celery db
    upgrade``); a missing table or column raises :class:`SchemaMissingError`
    on first use (:meth:`prepare`), before anything is written; building the
    store touches no database. For SQLite (the embedded default) the tables
    are created on first use unless ``create_tables=False``. Build
    SQLite engines with :func:`pikku_celery.db.make_engine`: its ``BEGIN
    IMMEDIATE`` is what serialises writers there.
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        create_tables: bool | None = None,
        upgrade_command: str | None = None,
    ) -> None:
        self._engine = engine
        self._settle: SettleListener | None = None
        self._claim_views: OrderedDict[tuple[str, int], _ClaimView] = OrderedDict()
        # Runs just created (PostgreSQL), by the creating thread: the first
        # pass that thread takes needs no read (the engine's start()).
        self._fresh_runs: OrderedDict[str, tuple[int, _ClaimView]] = OrderedDict()
        # The run's steps as this store's last optimistic pass left them, by
        # the step that pass scheduled: that step's claim then reads only the
        # run row, and takes the steps from here if the version still matches.
        self._passed = _PassedRuns()
        self._dialect = dialect_of(engine)
        self._st = statements(self._dialect)
        # PostgreSQL: single statements run in autocommit, which saves the
        # BEGIN and COMMIT round trips (psycopg's autocommit switch is local).
        self._single = (
            engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._dialect == "postgresql"
            else engine
        )
        self._direct: _Direct | None = None
        if self._st.pg_claim_view is not None and engine.dialect.driver == "psycopg":
            self._direct = _Direct(engine)
        self._create_tables = self._dialect == "sqlite" if create_tables is None else create_tables
        self._upgrade_command = upgrade_command
        self._claim_batch: Batch | None = None
        self._outcome_batches: dict[str, Batch] = {}
        self._ready = False
        self._ready_lock = threading.Lock()

    def prepare(self) -> None:
        """Check the schema (creating it first for SQLite) and learn what the
        connection can do; done once, on the store's first use.

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
                self._claim_batch, self._outcome_batches = self._batches()
            except sa.exc.DBAPIError as exc:
                first = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
                raise StoreUnavailableError(
                    f"the workflow database {hidden_url(engine.url)} is unreachable: {first}"
                ) from None
            self._ready = True

    def _batches(self) -> tuple[Batch | None, dict[str, Batch]]:
        """MySQL over PyMySQL connections that take multi-statement batches: a
        claim and an outcome are then one round trip each, COMMIT included."""
        if self._dialect != "mysql" or self._engine.dialect.driver != "pymysql":
            return None, {}
        with self._engine.connect() as conn:
            if not takes_batches(conn):
                return None, {}
        d, st = self._engine.dialect, self._st
        # MariaDB reads ROW_COUNT() inside a statement as the previous
        # statement's count (pinned by tests/store/test_mysql_batch.py);
        # MySQL gets the session-variable form.
        inline = bool(getattr(d, "is_mariadb", False))
        outcomes = {kind: Batch(d, st.mysql_outcome_batch(kind, inline)) for kind in st.fenced}
        return Batch(d, st.mysql_claim_batch(inline)), outcomes

    def _rows(self, stmt: Any, params: dict[str, Any]) -> Sequence[Any]:
        """The rows of one statement in its own transaction: on PostgreSQL's
        fast path where it can take it, else through SQLAlchemy."""
        if self._direct is not None:
            rows = self._direct.rows(stmt, params)
            if rows is not None:
                return rows
        with self._one() as conn:
            return conn.execute(stmt, params).all()

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
        """A connection for one statement: autocommit on PostgreSQL, else a
        short transaction."""
        with self._single.begin() as conn:
            yield conn

    def sweep_statements(self) -> dict[str, sa.Select[Any]]:
        """The sweep queries, for EXPLAIN (tests, DBAs checking their plans)."""
        st = self._st
        return {
            "lapsed_steps": st.lapsed,
            "undispatched_steps": st.undispatched,
            "due_steps": st.due,
            "idle_runs": st.idle,
        }

    # --- clock ---------------------------------------------------------------
    @_prepared
    def now_ms(self) -> int:
        with self._one() as conn:
            return int(conn.execute(self._st.now).scalar_one())

    # --- runs ----------------------------------------------------------------
    @_prepared
    def create_run(self, new: NewRun) -> tuple[RunState, bool]:
        text = dumps(new.input, f"workflow {new.workflow!r}", "input")
        st = self._st
        key = {"p_workflow": new.workflow, "p_key": new.idempotency_key}
        params = _run_params(new, text)
        try:
            if self._dialect == "postgresql" and new.idempotency_key is None:
                [made] = self._rows(st.run_insert_returning, params)
                now, updated = made.created_at, made.updated_at
            else:
                with self._one() as conn:
                    if new.idempotency_key is not None:
                        row = conn.execute(st.run_by_key, key).first()
                        if row is not None:
                            return _run_from(row), False
                    if self._dialect == "mysql":
                        now = updated = int(conn.execute(st.now).scalar_one())
                        conn.execute(
                            st.run_insert, {**params, "created_at": now, "updated_at": now}
                        )
                    else:
                        now, updated = conn.execute(st.run_insert_returning, params).one()
            run = replace(_new_run_state(new, text, int(now)), updated_at=int(updated))
            if self._st.pg_view is not None:
                fresh = _ClaimView(
                    run,
                    [],
                    run.updated_at,
                    False,
                    time.monotonic(),
                    run.updated_at + FRESH_RUN_MS,
                    len(text),
                )
                _remember(self._fresh_runs, run.id, (threading.get_ident(), fresh))
            return run, True
        except sa.exc.IntegrityError:
            if new.idempotency_key is not None:
                with self._one() as conn:
                    row = conn.execute(st.run_by_key, key).first()
                if row is not None:  # a concurrent start with the same key won
                    return _run_from(row), False
            raise StoreError(f"a workflow run with id {new.id!r} already exists") from None

    @_prepared
    def get_run(self, run_id: str) -> RunState | None:
        """The run, or None if there is no run with that id."""
        rows = self._rows(self._st.run_get, {"p_id": run_id})
        return _run_from(rows[0]) if rows else None

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
        stmt = self._st.list_runs(
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
            return [_run_from(r) for r in conn.execute(stmt, params)]

    def _locked_run(self, conn: sa.Connection, run_id: str) -> tuple[RunState, int]:
        """Lock the run row for this transaction, then read the DB clock."""
        self._fresh_runs.pop(run_id, None)  # about to change: its first pass must read
        row = conn.execute(self._st.run_lock, {"p_id": run_id}).first()
        if row is None:
            raise RunNotFoundError(f"no workflow run {run_id!r}")
        return _run_from(row), int(conn.execute(self._st.now).scalar_one())

    def _reread(self, conn: sa.Connection, run_id: str) -> RunState:
        return _run_from(conn.execute(self._st.run_get, {"p_id": run_id}).one())

    @_prepared
    def request_cancel(self, run_id: str) -> RunState:
        with self._engine.begin() as conn:
            run, now = self._locked_run(conn, run_id)
            if run.status.terminal or run.cancel_requested:
                return run
            conn.execute(self._st.run_cancel, {"p_id": run_id, "p_now": now})
            return self._reread(conn, run_id)

    @_prepared
    def send_signal(self, run_id: str, name: str, payload: JSON) -> RunState:
        text = dumps(payload, f"signal {name!r}", "payload")
        st = self._st
        with self._engine.begin() as conn:
            run, now = self._locked_run(conn, run_id)
            if run.status.terminal:
                raise RunSettledError(f"workflow run {run_id} is {run.status}; it takes no signals")
            # Every signal write holds the run lock, so check-then-insert is safe.
            if conn.execute(st.signal_exists, {"p_id": run_id, "p_name": name}).first() is None:
                conn.execute(
                    st.signal_insert,
                    {"run_id": run_id, "name": name, "payload": text, "created_at": now},
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
            conn.execute(self._st.steps_reopen, {"p_id": run_id, "p_now": now})
            conn.execute(self._st.run_reopen, {"p_id": run_id, "p_now": now})
            return self._reread(conn, run_id)

    # --- steps ---------------------------------------------------------------
    @_prepared
    def get_steps(self, run_id: str) -> list[StepState]:
        with self._one() as conn:
            return [_step_from(r) for r in conn.execute(self._st.steps_of_run, {"p_id": run_id})]

    @_prepared
    def get_step(self, step_id: str) -> StepState | None:
        """The step, or None if there is no step with that id."""
        with self._one() as conn:
            row = conn.execute(self._st.step_get, {"p_id": step_id}).first()
        return None if row is None else _step_from(row)

    @_prepared
    def get_attempts(self, run_id: str) -> list[AttemptState]:
        with self._one() as conn:
            rows = conn.execute(self._st.attempts_of_run, {"p_id": run_id})
            return [_attempt_from(r) for r in rows]

    @_prepared
    def claim_step(
        self,
        step_id: str,
        task_name: str,
        worker: str,
        lease_ms: int,
        *,
        run_id: str | None = None,
    ) -> StepState | None:
        st = self._st
        params = {
            "p_id": step_id,
            "p_run": run_id,
            "p_task": task_name,
            "p_worker": worker,
            "p_lease_ms": lease_ms,
        }
        if self._claim_batch is not None:
            return self._claim_batched(self._claim_batch, params)
        if st.pg_claim_view is not None:
            # One statement: the guarded update, the new attempt row, the
            # superseded mark of a lapsed attempt's row, and the run as its
            # pass will need it (kept for that pass: it skips its read).
            passed = self._passed.take(step_id)
            params["p_known"] = -1 if passed is None else passed.run.version
            rows = self._rows(st.pg_claim_view, params)
            if rows:
                return self._keep_claim_view(rows, passed)
        with self._one() as conn:
            if st.pg_claim_view is not None:
                row = None  # nothing to claim: say why below
            elif st.pg_claim is not None:
                row = conn.execute(st.pg_claim, params).first()
            elif self._dialect == "sqlite":
                row = conn.execute(st.claim_returning, params).first()
            else:  # MySQL: no RETURNING; read back in the same transaction
                claimed = conn.execute(st.claim, params).rowcount == 1
                row = conn.execute(st.step_get, {"p_id": step_id}).first() if claimed else None
            if row is None:
                recorded = conn.execute(st.step_task_name, {"p_id": step_id}).first()
                if (
                    recorded is not None
                    and run_id in (None, recorded.run_id)
                    and recorded.task_name != task_name
                ):
                    raise WorkflowStepFunctionMismatchError(step_id, recorded.task_name, task_name)
                return None
            step = _step_from(row)
            if st.pg_claim is None:
                conn.execute(
                    st.attempt_insert,
                    {
                        "step_id": step.id,
                        "attempt": step.attempt,
                        "run_id": step.run_id,
                        "status": AttemptStatus.RUNNING.value,
                        "worker": worker,
                        "started_at": step.updated_at,
                    },
                )
                if step.attempt > 1:
                    conn.execute(st.supersede, {"p_id": step.id, "p_attempt": step.attempt - 1})
            return step

    def _claim_batched(self, batch: Batch, params: dict[str, Any]) -> StepState | None:
        """MySQL: the claim's batch (statements.mysql_claim_batch), one round trip."""
        with self._engine.connect() as conn:
            _, rows, _names = run_batch(conn, batch, params)[-2]
        if not rows:
            return None
        row = SimpleNamespace(**dict(zip(_PACKED_CLAIM, json.loads(rows[0][0]), strict=True)))
        row.retry_delay, row.backoff = float(row.retry_delay), float(row.backoff)
        if not row.claimed_here:
            if params["p_run"] in (None, row.run_id) and row.task_name != params["p_task"]:
                raise WorkflowStepFunctionMismatchError(
                    params["p_id"], row.task_name, params["p_task"]
                )
            return None
        return _step_from(row)

    def _keep_claim_view(self, rows: Sequence[Any], passed: _Passed | None) -> StepState:
        """The claimed step; the run as the PostgreSQL claim read it is kept
        for that attempt's pass."""
        head = rows[0]
        m = head._mapping
        claimed = SimpleNamespace(**{name: m["c_" + name] for name in _STEP_COLUMNS})
        step = _step_from(claimed)
        run = None
        input_size = len(m["r_input"] or "")
        if passed is not None and head.r_version == passed.run.version:
            # The claim read no steps and no input: no pass has landed since ours.
            run, input_size = passed.run, passed.input_size
            steps = [step if s.id == step.id else s for s in passed.steps]
        elif len(rows) > CLAIM_VIEW_STEPS or step.seq >= CLAIM_VIEW_STEPS:
            return step  # a big run: the claim read at most its first steps
        else:
            steps = [step if r.id == step.id else _step_from(r) for r in rows if r.id is not None]
        _remember(
            self._claim_views,
            (step.id, step.attempt),
            _ClaimView(
                run or _run_from(head, "r_"),
                steps,
                int(head.db_now),
                bool(head.has_signals),
                time.monotonic(),
                int(step.lease_expires_at or 0),
                input_size,
            ),
        )
        return step

    @_prepared
    def refresh_step_lease(self, step_id: str, attempt: int, lease_ms: int | None) -> bool:
        params = {"p_id": step_id, "p_attempt": attempt, "p_lease_ms": lease_ms}
        stmt = self._st.park if lease_ms is None else self._st.renew
        with self._one() as conn:
            return conn.execute(stmt, params).rowcount == 1

    def _fenced_write(self, conn: sa.Connection, write: Fenced, params: dict[str, Any]) -> bool:
        """Run a fenced outcome write; False (nothing written) if superseded."""
        if write.cte is not None:
            return int(conn.execute(write.cte, params).scalar_one()) == 1
        if write.both is not None:
            return conn.execute(write.both, params).rowcount == 2
        if conn.execute(write.step, params).rowcount != 1:
            return False
        conn.execute(write.attempt, params)
        return True

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        """A standalone fenced outcome: one round trip where batches are taken."""
        batch = self._outcome_batches.get(kind)
        if batch is not None:
            with self._engine.connect() as conn:
                return run_batch(conn, batch, params)[0][0] == 1
        with self._one() as conn:
            return self._fenced_write(conn, self._st.fenced[kind], params)

    @_prepared
    def complete_step(self, step_id: str, attempt: int, result: JSON) -> None:
        text = dumps(result, f"step {step_id}", "result")
        params = {"p_id": step_id, "p_attempt": attempt, "p_result": text}
        if not self._fenced_outcome("complete", params):
            raise WorkflowStepSupersededError(step_id, attempt)

    @_prepared
    def complete_in_transaction(
        self, step_id: str, attempt: int, body: Callable[[sa.Connection], JSON]
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
            }
            if not self._fenced_write(conn, self._st.fenced["complete"], params):
                raise WorkflowStepSupersededError(step_id, attempt)
        return result

    @_prepared
    def fail_step(
        self, step_id: str, attempt: int, error: ErrorInfo, retry_delay: float | None = None
    ) -> None:
        text = dumps(error, f"step {step_id}", "error")
        params = {
            "p_id": step_id,
            "p_attempt": attempt,
            "p_error": text,
            "p_delay_ms": None if retry_delay is None else round(retry_delay * 1000),
        }
        if not self._fenced_outcome("fail" if retry_delay is None else "fail_retry", params):
            raise WorkflowStepSupersededError(step_id, attempt)

    @_prepared
    def expire_step(self, step_id: str, bound_ms: int | None = None) -> bool:
        st = self._st
        with self._engine.begin() as conn:
            row = conn.execute(st.step_get, {"p_id": step_id}).first()
            if row is None:
                return False
            step = _step_from(row)
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
            conn.execute(self._st.mark_scheduled, {"p_ids": list(step_ids)})

    # --- the orchestration pass ---------------------------------------------
    @_prepared
    def advance(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        """One pass, atomic and serialised per run.

        On PostgreSQL a pass with an outcome first tries the optimistic path
        (:meth:`_advance_optimistic`); every other pass, and any the
        optimistic path hands back, is the locked pass (:meth:`_advance`).
        A deadlock (a child run ending while its parent cancels it, each
        holding its own run row) rolls back and retries the whole pass. So
        ``decide`` may be called more than once and must be a pure function
        of the view (the replay is). A value the database refuses (a
        ``DataError`` or ``IntegrityError``) is raised as :class:`StoreError`.
        """
        for attempt in range(DEADLOCK_RETRIES):
            try:
                done = None
                first = None
                if self._st.pg_view is not None and outcome is not None:
                    done = self._advance_optimistic(run_id, outcome, decide)
                elif self._st.pg_view is not None and self._created_here(run_id):
                    first = _FirstPass(decide)
                    done = self._advance_optimistic(run_id, outcome, first.decide)
                if done is not None:
                    return done  # a run it ended was announced by its statement
                done = self._advance(run_id, outcome, decide, first)
            except sa.exc.DBAPIError as exc:
                if attempt + 1 < DEADLOCK_RETRIES and _is_deadlock(exc):
                    continue
                if isinstance(exc, (sa.exc.DataError, sa.exc.IntegrityError)):
                    # A value the database will not take: the same on every
                    # replay, so a store error (the engine then fails the run).
                    first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else ""
                    raise StoreError(
                        f"the database refused what the pass of run {run_id} decided: {first_line}"
                    ) from exc
                raise
            if (
                self._dialect == "postgresql"
                and done.decision is not None
                and done.run.status.terminal
            ):
                self._notify_settled(run_id)
            return done
        raise AssertionError("unreachable")  # pragma: no cover

    # --- waiting for a run to settle (PostgreSQL LISTEN/NOTIFY) ---------------
    def _notify_settled(self, run_id: str) -> None:
        """Tell waiting ``RunHandle.wait`` calls, once per run, after commit."""
        params = {"channel": SETTLED_CHANNEL, "run_id": run_id}
        # On failure: waiters re-check the run's status at least every second.
        with contextlib.suppress(sa.exc.DBAPIError):
            self._rows(NOTIFY_SETTLED, params)

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[Callable[[float], None] | None]:
        """On PostgreSQL, ``wait(timeout)`` returning when a pass settles
        ``run_id`` (registered before the caller reads its status); else None."""
        if self._dialect != "postgresql":
            yield None
            return
        if self._settle is None:
            self._settle = SettleListener(self._engine)
        with self._settle.watch(run_id) as wait:
            yield wait

    def _created_here(self, run_id: str) -> bool:
        """Whether this thread created ``run_id`` and has not advanced it yet."""
        return self._fresh_runs.get(run_id, (0, None))[0] == threading.get_ident()

    def _advance_optimistic(
        self, run_id: str, outcome: StepOutcome | None, decide: Decide
    ) -> AdvanceResult | None:
        """PostgreSQL's hot path: one unlocked read, then the whole pass as one
        version-checked statement (:meth:`.statements.Statements.pg_pass`), both in
        autocommit: two round trips and one commit.

        None, with nothing written, when the locked pass must do it instead:
        the version moved (another pass or a signal came first), the run has
        ended, or the decision is not a plain sequential step (fan-out, child
        runs, resolutions...). The locked pass then reads and decides afresh,
        so ``decide`` must be pure (the replay is).
        """
        st = self._st
        assert st.pg_view is not None
        if outcome is None:  # a run this thread just created: nothing to read
            kept = self._fresh_runs.pop(run_id, (0, None))[1]
            if kept is None or not kept.still_ours(run_id):
                return None  # the locked pass reads it
        else:
            kept = self._claim_views.pop((outcome.step_id, outcome.attempt), None)
        if kept is not None and kept.still_ours(run_id):
            # Read at claim time; "now" moves on by this process's
            # monotonic clock, anchored on the database's.
            run, steps, has_signals = kept.run, kept.steps, kept.has_signals
            now, input_size = kept.now(), kept.input_size
        else:
            with self._one() as conn:
                rows = conn.execute(st.pg_view, {"p_id": run_id}).all()
            if not rows:
                raise RunNotFoundError(f"no workflow run {run_id!r}")
            head = rows[0]
            run = _run_from(head, "r_")
            now, input_size = int(head.db_now), len(head.r_input or "")
            steps = [_step_from(r) for r in rows if r.id is not None]
            has_signals = bool(head.has_signals)
        if run.status.terminal:
            return None
        kind: str | None = None
        written: dict[str, Any] = {"p_now": now}
        if outcome is not None:
            prepared = _prepare_outcome(steps, outcome, now)
            kind, steps, written = prepared.kind, prepared.steps, prepared.params
        signals: dict[str, JSON] = {}
        if has_signals:
            with self._one() as conn:
                for name, payload in conn.execute(st.signals_of_run, {"p_id": run_id}):
                    signals[name] = loads(payload)
        view = RunView(run=run, steps=steps, signals=signals, now=now)
        decision = decide(view)
        encoded = encode_decision(run, {s.id: s.name for s in view.steps}, decision)
        ends = decision.run_status is not None and decision.run_status.terminal
        if (
            decision.resolutions
            or decision.redispatch
            or decision.cancel_children
            or decision.run_status == RunStatus.CANCELLED  # closes the run's open steps
            or len(encoded.steps) > 1
            or any(e.child_input is not None for e in encoded.steps)
            or (ends and run.parent_run_id is not None)
        ):
            return None
        params: dict[str, Any] = {
            **written,
            "p_run": run.id,
            "p_version": run.version,
            "p_wake_at": decision.wake_at,
        }
        new_run = replace(
            run,
            version=run.version + 1,
            updated_at=now,
            wake_at=decision.wake_at,
            next_sweep_at=None,
            sweep_count=0,
        )
        if ends:
            assert decision.run_status is not None
            params.update(
                p_run_status=decision.run_status.value,
                p_output=encoded.output,
                p_run_error=encoded.error,
            )
            new_run = replace(
                new_run,
                status=decision.run_status,
                output=loads(encoded.output),
                error=loads(encoded.error),
                wake_at=None,
            )
        publish: list[StepState] = []
        for enc in encoded.steps:
            step = _new_step_state(run, enc, now)
            row = _step_params(step, enc.args, enc.kwargs, enc.value)
            params.update({f"n_{k}": v for k, v in row.items()})
            if step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
                publish.append(step)
        pinned, fenced = self._pass_write((kind, bool(encoded.steps), ends), params)
        if not pinned:
            return None
        if not fenced:
            assert outcome is not None  # a pass without one is fenced by its pin
            raise WorkflowStepSupersededError(outcome.step_id, outcome.attempt)
        if len(publish) == 1 and len(encoded.steps) == 1:
            self._passed.put(publish[0].id, _Passed(new_run, [*steps, publish[0]], input_size))
        return AdvanceResult(run=new_run, steps=publish, decision=decision)

    def _pass_write(self, shape: tuple[str | None, bool, bool], params: dict[str, Any]) -> Any:
        """The optimistic pass's one statement: (pinned, fenced)."""
        [row] = self._rows(self._st.pg_pass(*shape), params)
        return row.pinned, row.fenced

    def _advance(
        self,
        run_id: str,
        outcome: StepOutcome | None,
        decide: Decide,
        first: _FirstPass | None = None,
    ) -> AdvanceResult:
        """The general pass: read, decide with no transaction open, then write
        under the run's row lock if no pass landed in between (else again).

        ``decide`` runs the user's body: holding a lock or a transaction over
        it would let one slow body stall ``runs cancel`` and every other
        writer of the run.
        """
        st = self._st
        for _ in range(PASS_RACES):
            with self._one() as conn:
                row = conn.execute(st.run_get, {"p_id": run_id}).first()
                if row is None:
                    raise RunNotFoundError(f"no workflow run {run_id!r}")
                run = _run_from(row)
                if run.status.terminal and outcome is None:
                    return AdvanceResult(run=run, steps=[], decision=None)
                rows = conn.execute(st.pass_read, {"p_id": run_id}).all()
                signals: dict[str, JSON] = {}
                if rows[0].has_signals:
                    for name, payload in conn.execute(st.signals_of_run, {"p_id": run_id}):
                        signals[name] = loads(payload)
            now = int(rows[0].db_now)
            steps = [_step_from(r) for r in rows if r.id is not None]
            prepared = None if outcome is None else _prepare_outcome(steps, outcome, now)
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
                self._fresh_runs.pop(run_id, None)
                version = conn.execute(st.run_version_lock, {"p_id": run_id}).scalar()
                if version != run.version:
                    continue  # another pass or a signal landed: read and decide again
                if prepared is not None:
                    assert outcome is not None
                    if not self._fenced_write(conn, st.fenced_at[prepared.kind], prepared.params):
                        raise WorkflowStepSupersededError(outcome.step_id, outcome.attempt)
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
        st = self._st
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
            by_id[step.id] = replace(
                step,
                status=status,
                result=loads(enc.result),
                error=loads(enc.error),
                lease_expires_at=None,
                wake_at=None,
                updated_at=now,
            )
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

        children = self._insert_steps(conn, run, encoded, now, publish)

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
            new_run = replace(
                run,
                status=decision.run_status,
                output=loads(encoded.output),
                error=loads(encoded.error),
                wake_at=None,
            )
            parent_to_wake = self._settle_parent_step(conn, new_run, decision, now)
        else:
            conn.execute(st.run_pass, {"p_id": run.id, "p_now": now, "p_wake_at": decision.wake_at})
            new_run = replace(run, wake_at=decision.wake_at)
        new_run = replace(
            new_run, version=run.version + 1, updated_at=now, next_sweep_at=None, sweep_count=0
        )
        return AdvanceResult(
            run=new_run,
            steps=publish,
            decision=decision,
            parent_to_wake=parent_to_wake,
            children_to_wake=children,
        )

    def _insert_steps(
        self,
        conn: sa.Connection,
        run: RunState,
        encoded: EncodedDecision,
        now: int,
        publish: list[StepState],
    ) -> list[str]:
        """Insert the pass's new steps (and child runs), batched per table."""
        if not encoded.steps:
            return []
        steps: list[dict[str, Any]] = []
        child_runs: list[dict[str, Any]] = []
        attempts: list[dict[str, Any]] = []
        children: list[str] = []
        for enc in encoded.steps:
            new = enc.new
            step = _new_step_state(run, enc, now)
            if new.kind != StepKind.VALUE and new.child is not None and enc.child_input is not None:
                child = replace(
                    new.child, parent_run_id=run.id, parent_step_id=enc.id, depth=run.depth + 1
                )
                child_runs.append(
                    {**_run_params(child, enc.child_input), "created_at": now, "updated_at": now}
                )
                step = replace(
                    step,
                    status=StepStatus.RUNNING,
                    attempt=1,
                    lease_expires_at=None,
                    child_run_id=child.id,
                )
                attempts.append(
                    {
                        "step_id": enc.id,
                        "attempt": 1,
                        "run_id": run.id,
                        "status": AttemptStatus.RUNNING.value,
                        "worker": None,
                        "started_at": now,
                    }
                )
                children.append(child.id)
            steps.append(_step_params(step, enc.args, enc.kwargs, enc.value))
            if step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
                publish.append(step)
        if child_runs:
            conn.execute(self._st.run_insert, child_runs)
        try:
            conn.execute(self._st.step_insert, steps)
        except sa.exc.IntegrityError as exc:
            raise DuplicateStepError(
                f"workflow run {run.id} already has one of the steps "
                f"{[e.new.name for e in encoded.steps]!r}"
            ) from exc
        if attempts:
            conn.execute(self._st.attempt_insert, attempts)
        return children

    def _settle_parent_step(
        self, conn: sa.Connection, run: RunState, decision: Decision, now: int
    ) -> str | None:
        """The ended child run settles its parent's parked step (rules.child_outcome)."""
        if run.parent_run_id is None or run.parent_step_id is None:
            return None
        st = self._st
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
            return [_step_from(r) for r in conn.execute(self._st.lapsed, params)]

    @_prepared
    def undispatched_steps(self, older_than_ms: int, limit: int) -> list[StepState]:
        params = {"p_older_ms": older_than_ms, "p_limit": limit}
        with self._one() as conn:
            return [_step_from(r) for r in conn.execute(self._st.undispatched, params)]

    @_prepared
    def due_steps(self, limit: int) -> list[StepState]:
        with self._one() as conn:
            return [_step_from(r) for r in conn.execute(self._st.due, {"p_limit": limit})]

    @_prepared
    def idle_runs(self, idle_ms: int, limit: int) -> list[RunState]:
        params = {"p_idle_ms": idle_ms, "p_limit": limit}
        with self._one() as conn:
            return [_run_from(r) for r in conn.execute(self._st.idle, params)]

    @_prepared
    def mark_blocked(self, run_id: str, reason: str) -> None:
        with self._one() as conn:
            conn.execute(self._st.mark_blocked, {"p_id": run_id, "p_reason": reason})

    @_prepared
    def waiting_by_queue(self, older_than_ms: int) -> list[tuple[str | None, int, int]]:
        with self._one() as conn:
            rows = conn.execute(self._st.waiting_by_queue, {"p_older_ms": older_than_ms})
            return [(r.queue, int(r.steps), int(r.oldest_ms)) for r in rows]

    @_prepared
    def note_swept(self, run_id: str, backoff_ms: int, max_backoff_ms: int | None = None) -> bool:
        params = {
            "p_id": run_id,
            "p_backoff_ms": backoff_ms,
            "p_max_backoff_ms": backoff_ms if max_backoff_ms is None else max_backoff_ms,
        }
        with self._one() as conn:
            return conn.execute(self._st.note_swept, params).rowcount == 1
