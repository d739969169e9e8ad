"""Every statement of the portable SQL workflow store, each under a name.

Kept apart from :mod:`.sql` (the store's behaviour) so each statement can be
read, compiled and EXPLAINed on its own, and found by name
(:meth:`Statements.named`): tests, EXPLAIN checks and traces say
``"claim"``, never an attribute. What a dialect does differently lives in its
subclass (:mod:`.statements_postgres`, :mod:`.statements_mysql`). Times are
epoch milliseconds on the database's clock (the ``clock`` each dialect
passes in); a pass that must use one 'now' for several rows binds ``p_now``,
read earlier in its transaction.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from .model import AttemptStatus, RunStatus, StepKind, StepStatus
from .rules import SWEEP_BACKOFF_DOUBLINGS
from .schema import attempt_table, audit_table, run_table, signal_table, step_table

R, S, A, G = run_table, step_table, attempt_table, signal_table
AU = audit_table
TERMINAL = [RunStatus.COMPLETED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value]


def _p(name: str, type_: sa.types.TypeEngine[Any] | None = None) -> sa.BindParameter[Any]:
    """A named bind parameter; all are prefixed ``p_`` so none clashes with
    the automatic parameters of a SET or VALUES clause."""
    return sa.bindparam(f"p_{name}", type_=type_)


def _settled(t: sa.Table) -> ColumnElement[bool]:
    return sa.or_(
        t.c.status == StepStatus.SUCCEEDED.value,
        sa.and_(t.c.status == StepStatus.FAILED.value, t.c.wake_at.is_(None)),
    )


def _unsettled(t: sa.Table) -> ColumnElement[bool]:
    return sa.or_(
        _status_in(t, StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING),
        sa.and_(t.c.status == StepStatus.FAILED.value, t.c.wake_at.is_not(None)),
    )


def _status_in(t: sa.Table, *statuses: str) -> ColumnElement[bool]:
    """``status IN (...)`` spelled as ORs: a constant IN list would compile to
    an 'expanding' parameter that SQLAlchemy rewrites on every execution."""
    return sa.or_(*[t.c.status == str(s) for s in statuses])


def _not_terminal(t: sa.Table) -> ColumnElement[bool]:
    return sa.and_(*[t.c.status != s for s in TERMINAL])


ID_TYPE = sa.String(36)


def _lapsed(t: sa.Table, now: ColumnElement[int], bound: ColumnElement[int]) -> ColumnElement[bool]:
    """The lease lapsed, or ends beyond ``now + bound`` (no worker was granted
    that: an edited row). NULL leases (parked steps) never lapse; a NULL bound
    bounds nothing."""
    return sa.and_(
        t.c.lease_expires_at.is_not(None),
        sa.or_(t.c.lease_expires_at <= now, t.c.lease_expires_at > now + bound),
    )


def _run_pass_values(at: ColumnElement[int]) -> dict[str, Any]:
    """What every pass writes on its run row (on the pass's clock ``at``): a
    new version, the next wake-up, and the sweep's backoff and any block
    cleared (a pass ran)."""
    return {
        "version": R.c.version + 1,
        "updated_at": at,
        "wake_at": _p("wake_at", sa.BigInteger()),
        "next_sweep_at": sa.null(),
        "sweep_count": 0,
        "blocked": sa.null(),
    }


def optimistic_run_values(at: ColumnElement[int], ends: bool) -> dict[str, Any]:
    """The run row as the optimistic pass writes it (parameters ``p_wake_at``,
    and when it ``ends`` the run, ``p_run_status``, ``p_output`` and
    ``p_run_error``): the dialects' one-go writes of a pass share it."""
    values = _run_pass_values(at)
    if ends:
        values.update(
            wake_at=sa.null(),
            status=_p("run_status"),
            output=_p("output"),
            error=_p("run_error"),
        )
    return values


def _lit(value: str) -> ColumnElement[str]:
    """An inline SQL string constant (used inside INSERT ... SELECT)."""
    return sa.literal_column(f"'{value}'", sa.String())


OUTCOMES = ("complete", "fail", "fail_retry")
CLAIM_TYPE = sa.String(32)
CLAIMED_ATTEMPT_COLUMNS = [
    "step_id",
    "attempt",
    "run_id",
    "status",
    "worker",
    "started_at",
    "claim_id",
    "dispatch",
    "task_id",
    "node",
]
"""The attempt row a claim writes, in the order its INSERT ... SELECT gives them."""


def claim_delivery() -> tuple[sa.BindParameter[Any], sa.BindParameter[Any]]:
    """The claim's Celery message id and node (``p_task_id``, ``p_node``),
    bound into the statement that writes its attempt row."""
    return _p("task_id", sa.String(255)), _p("node", sa.String(255))


def _claim_matches() -> ColumnElement[bool]:
    """The write's claim is the step's current claim (a NULL claim: any)."""
    claim = _p("claim", CLAIM_TYPE)
    return sa.or_(claim.is_(None), S.c.claim_id == claim)


FENCE = (
    S.c.id == _p("id"),
    S.c.attempt == _p("attempt"),
    S.c.status == StepStatus.RUNNING.value,
    _claim_matches(),
)


def _outcome_values(kind: str, now: ColumnElement[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(step row SET, attempt row SET) of outcome ``kind`` on the clock ``now``."""
    step: dict[str, Any] = {
        "status": StepStatus.SUCCEEDED.value,
        "result": _p("result"),
        "error": sa.null(),
        "wake_at": sa.null(),
    }
    attempt: dict[str, Any] = {"status": AttemptStatus.SUCCEEDED.value, "result": _p("result")}
    if kind != "complete":
        retry_at = sa.case(
            (S.c.attempt < S.c.max_attempts, now + _p("delay_ms", sa.BigInteger())),
            else_=sa.null(),
        )
        step = {
            "status": StepStatus.FAILED.value,
            "result": sa.null(),
            "error": _p("error"),
            "wake_at": retry_at if kind == "fail_retry" else sa.null(),
            "scheduled_at": sa.null(),  # the next attempt's message is not sent yet
        }
        attempt = {"status": AttemptStatus.FAILED.value, "error": _p("error")}
    step.update(lease_expires_at=sa.null(), updated_at=now)
    return step, attempt


def fenced_pair(kind: str, now: ColumnElement[int]) -> tuple[sa.Update, sa.Update]:
    """The fenced write of outcome ``kind`` as (step row, attempt row), on ``now``."""
    step_values, attempt_values = _outcome_values(kind, now)
    step = sa.update(S).where(*FENCE).values(**step_values)
    attempt = (
        sa.update(A)
        .where(A.c.step_id == _p("id"), A.c.attempt == _p("attempt"))
        .values(**attempt_values, finished_at=now)
    )
    return step, attempt


def _sweep_backoff(count: ColumnElement[int]) -> ColumnElement[int]:
    """rules.sweep_backoff_ms in SQL: ``p_backoff_ms * 2 ** count``, at most
    ``p_max_backoff_ms``; ``count`` is the row's ``sweep_count``."""
    doubling = sa.case(
        *[(count == i, 2**i) for i in range(SWEEP_BACKOFF_DOUBLINGS)],
        else_=2**SWEEP_BACKOFF_DOUBLINGS,
    )
    wait = _p("backoff_ms", sa.BigInteger()) * doubling
    cap = _p("max_backoff_ms", sa.BigInteger())
    return sa.case((wait > cap, cap), else_=wait)


def _union_oldest(
    members: Sequence[sa.Select[Any]], order: Callable[[Any], ColumnElement[Any]]
) -> sa.Select[Any]:
    """Oldest first across several index ranges, at most ``p_limit`` rows.

    Each member is one equality-prefixed range of an index, ordered and
    limited on its own, so each is an index range scan; the union of at most
    ``len(members) * limit`` rows is then sorted. Members are wrapped as
    subqueries so SQLite accepts their ORDER BY/LIMIT.
    """
    limit = _p("limit", sa.Integer())
    subs = [sa.select(m.limit(limit).subquery()) for m in members]
    union = sa.union_all(*subs).subquery("oldest")
    return sa.select(union).order_by(order(union.c)).limit(limit)


RUN_FILTERS = ("status", "workflow", "since", "until")


class Statements:
    """Every statement the portable store runs, built once per dialect's clock."""

    def __init__(self, clock: ColumnElement[int]) -> None:
        now = clock
        at = _p("now", sa.BigInteger())  # a DB-clock 'now' read earlier in the transaction
        self.now = sa.select(now)
        self._runs(now, at)
        self._steps(now, at)
        self._claims(now, at)
        self._outcomes(now, at)
        self._pass_writes(now, at)
        self._pass_view(now)
        self._sweep(now, at)
        self._in_flight()

    def named(self) -> dict[str, sa.ClauseElement]:
        """Every statement by name; a family built per shape (``list_runs``,
        a dialect's pass) under ``name[shape]``, each shape built here."""
        found: dict[str, sa.ClauseElement] = {}
        for name, value in vars(self).items():
            if isinstance(value, sa.ClauseElement):
                found[name] = value
            elif isinstance(value, dict):
                for key, member in value.items():
                    if isinstance(member, sa.ClauseElement):
                        found[f"{name}[{key}]"] = member
        for flags in itertools.product((False, True), repeat=4):
            shape = ",".join(f for f, on in zip(RUN_FILTERS, flags, strict=True) if on)
            found[f"list_runs[{shape}]"] = self.list_runs(*flags)
        for flags in itertools.product((False, True), repeat=3):
            shape = ",".join(f for f, on in zip(RUN_FILTERS[1:], flags, strict=True) if on)
            found[f"count_runs[{shape}]"] = self.count_runs(*flags)
        found.update(self._families())
        return found

    def _families(self) -> Iterator[tuple[str, sa.ClauseElement]]:
        """A dialect's statement families, named by shape (none here)."""
        return iter(())

    def _pass_view(self, now: ColumnElement[int]) -> None:
        """The optimistic pass's read (:mod:`.sql_optimistic`): the run, its
        clock, whether it has signals and its steps, unlocked, in one go."""
        run_head = (
            sa.select(
                *[c.label(f"r_{c.name}") for c in R.c],
                now.label("db_now"),
                sa.exists().where(G.c.run_id == R.c.id).label("has_signals"),
            )
            .where(R.c.id == _p("id"))
            .subquery("head")
        )
        self.pass_view = (
            sa.select(run_head, S)
            .select_from(run_head.outerjoin(S, S.c.run_id == run_head.c.r_id))
            .order_by(S.c.seq)
        )

    def _runs(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Runs: read, lock, create, cancel, reopen; signals."""
        self.run_get = sa.select(R).where(R.c.id == _p("id"))
        # FOR UPDATE where the dialect has it (SQLite's writers are serialised
        # by BEGIN IMMEDIATE; SQLAlchemy renders nothing there).
        self.run_lock = self.run_get.with_for_update()
        # The pass's write locks the run and checks nobody passed since its read.
        version = sa.select(R.c.version).where(R.c.id == _p("id"))
        self.run_version_lock = version.with_for_update()
        # Cancel closes what a cancelled run still has open: a live step's
        # worker finds its outcome refused, and no row stays 'running'.
        self.close_live_steps = (
            sa.update(S)
            .where(
                S.c.run_id == _p("id"),
                _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING),
            )
            .values(
                status=StepStatus.FAILED.value,
                error=_p("error"),
                lease_expires_at=sa.null(),
                wake_at=sa.null(),
                updated_at=at,
            )
        )
        self.close_live_attempts = (
            sa.update(A)
            .where(A.c.run_id == _p("id"), A.c.status == AttemptStatus.RUNNING.value)
            .values(status=AttemptStatus.CANCELLED.value, error=_p("error"), finished_at=at)
        )
        self.run_by_key = sa.select(R).where(
            R.c.workflow == _p("workflow"), R.c.idempotency_key == _p("key")
        )
        self.run_insert = sa.insert(R)
        not_terminal = _not_terminal(R)
        self.run_cancel = (
            sa.update(R)
            .where(R.c.id == _p("id"), not_terminal, R.c.cancel_requested == sa.false())
            .values(cancel_requested=True, version=R.c.version + 1, updated_at=at)
        )
        self.mark_blocked = (
            sa.update(R).where(R.c.id == _p("id"), not_terminal).values(blocked=_p("reason"))
        )
        self.run_touch = (
            sa.update(R).where(R.c.id == _p("id")).values(version=R.c.version + 1, updated_at=at)
        )
        self.run_reopen = (
            sa.update(R)
            .where(R.c.id == _p("id"))
            .values(
                status=RunStatus.RUNNING.value,
                error=sa.null(),
                wake_at=at,
                version=R.c.version + 1,
                updated_at=at,
            )
        )
        self.steps_reopen = (
            sa.update(S)
            .where(
                S.c.run_id == _p("id"),
                S.c.kind == StepKind.TASK.value,
                S.c.status == StepStatus.FAILED.value,
            )
            .values(wake_at=at, max_attempts=S.c.attempt + S.c.max_attempts, updated_at=at)
        )
        self.signal_payload = sa.select(G.c.payload).where(
            G.c.run_id == _p("id"), G.c.name == _p("name")
        )
        self.signal_insert = sa.insert(G)
        self.signals_of_run = sa.select(G.c.name, G.c.payload).where(G.c.run_id == _p("id"))
        # For people (the run page, the command line), not the hot path.
        self.signals_in_order = self.signals_of_run.order_by(G.c.created_at, G.c.name)
        # A person's search, bounded by the limit: ix_pikku_run_key_created
        # (the unique index leads with the workflow).
        self.runs_with_key = (
            sa.select(R)
            .where(R.c.idempotency_key == _p("key"))
            .order_by(R.c.created_at.desc(), R.c.id.desc())
            .limit(_p("limit", sa.Integer()))
        )
        # The audit trail: appended at the transaction's clock, read per run.
        self.audit_insert = sa.insert(AU).values(
            run_id=_p("id"),
            action=_p("action"),
            actor=_p("actor"),
            origin=_p("origin"),
            details=_p("details"),
            at=at,
        )
        self.audit_of_run = sa.select(AU).where(AU.c.run_id == _p("id")).order_by(AU.c.id)
        self.steps_by_status = sa.select(S.c.status, sa.func.count()).group_by(S.c.status)
        self.attempts_by_status = sa.select(A.c.status, sa.func.count()).group_by(A.c.status)

    def _steps(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Steps and attempts: read and insert; the pass's read."""
        self.step_get = sa.select(S).where(S.c.id == _p("id"))
        self.step_task_name = sa.select(S.c.run_id, S.c.task_name).where(S.c.id == _p("id"))
        self.steps_of_run = sa.select(S).where(S.c.run_id == _p("id")).order_by(S.c.seq)
        # The pass's read: its DB 'now', whether the run has signals, and its
        # steps in order; one row of NULL step columns when it has none.
        head = sa.select(
            now.label("db_now"),
            sa.exists().where(G.c.run_id == _p("id")).label("has_signals"),
        ).subquery("head")
        self.pass_read = (
            sa.select(head.c.db_now, head.c.has_signals, S)
            .select_from(head.outerjoin(S, S.c.run_id == _p("id")))
            .order_by(S.c.seq)
        )
        # through the run's steps: the attempt table needs no index of its own
        self.attempts_of_run = (
            sa.select(A)
            .join(S, S.c.id == A.c.step_id)
            .where(S.c.run_id == _p("id"))
            .order_by(A.c.started_at, A.c.step_id, A.c.attempt)
        )
        self.step_insert = sa.insert(S)
        self.attempt_insert = sa.insert(A)

    def _claims(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Rule 1 (the claim) and rule 3 (fenced renewal)."""
        # Rule 1: the claim is one guarded write on the DB clock.
        claimable = sa.or_(
            _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
            sa.and_(
                S.c.status == StepStatus.FAILED.value,
                S.c.attempt < S.c.max_attempts,
                S.c.wake_at.is_not(None),
                S.c.wake_at <= now,
            ),
            sa.and_(
                S.c.status == StepStatus.RUNNING.value,
                # its own expiry, never the claimer's lease length
                _lapsed(S, now, _p("bound_ms", sa.BigInteger())),
                S.c.attempt < S.c.max_attempts,
            ),
        )
        self.claim = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                # a message naming a step of another run is refused (NULL: any run)
                sa.or_(_p("run", ID_TYPE).is_(None), S.c.run_id == _p("run", ID_TYPE)),
                S.c.task_name == _p("task"),
                S.c.kind == StepKind.TASK.value,
                claimable,
            )
            .values(
                status=StepStatus.RUNNING.value,
                attempt=S.c.attempt + 1,
                lease_expires_at=now + _p("lease_ms", sa.BigInteger()),
                wake_at=sa.null(),
                worker=_p("worker"),
                result=sa.null(),
                error=sa.null(),
                updated_at=now,
                claim_id=_p("claim", CLAIM_TYPE),
            )
        )
        # A lapsed takeover leaves the previous attempt row 'running' (a failed
        # or expired attempt row is never 'running'): mark it superseded.
        self.supersede = (
            sa.update(A)
            .where(
                A.c.step_id == _p("id"),
                A.c.attempt == _p("attempt"),
                A.c.status == AttemptStatus.RUNNING.value,
            )
            .values(status=AttemptStatus.SUPERSEDED.value)
        )

        # Rule 3: renewal is fenced and never revives a lapsed lease.
        renewable = (
            S.c.id == _p("id"),
            S.c.attempt == _p("attempt"),
            S.c.status == StepStatus.RUNNING.value,
            _claim_matches(),
            sa.or_(S.c.lease_expires_at.is_(None), S.c.lease_expires_at > now),
        )
        self.renewable = renewable
        self.renew = (
            sa.update(S)
            .where(*renewable)
            .values(lease_expires_at=now + _p("lease_ms", sa.BigInteger()), updated_at=now)
        )
        # The renewal counted on its attempt row (the run page's timeline).
        # Where one statement can write both rows (PostgreSQL, MySQL) the
        # dialect's renewal does; SQLite runs this after ``renew``, in its
        # transaction, with the time ``renew`` wrote (a second clock read
        # could fall in the next millisecond).
        self.renew_counted = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), A.c.attempt == _p("attempt"))
            .values(
                renewals=A.c.renewals + 1,
                renewed_at=sa.select(S.c.updated_at).where(S.c.id == _p("id")).scalar_subquery(),
            )
        )
        self.park = (
            sa.update(S).where(*renewable).values(lease_expires_at=sa.null(), updated_at=now)
        )

    def _outcomes(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Rule 2 (fenced outcomes) and rule 5 (a lapsed last attempt fails)."""
        # Rule 2: fenced outcomes, on the statement's clock (standalone) or on
        # the pass's 'now' (inside advance, so the view and the rows agree):
        # the step row's write, then its attempt row's.
        standalone = {kind: fenced_pair(kind, now) for kind in OUTCOMES}
        in_pass = {kind: fenced_pair(kind, at) for kind in OUTCOMES}
        self.fenced_step = {kind: pair[0] for kind, pair in standalone.items()}
        self.fenced_attempt = {kind: pair[1] for kind, pair in standalone.items()}
        self.fenced_at_step = {kind: pair[0] for kind, pair in in_pass.items()}
        self.fenced_at_attempt = {kind: pair[1] for kind, pair in in_pass.items()}

        # Rule 5: a lapsed last attempt fails for good.
        self.expire = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                S.c.attempt == _p("attempt"),
                S.c.status == StepStatus.RUNNING.value,
                _lapsed(S, now, _p("bound_ms", sa.BigInteger())),
                S.c.attempt >= S.c.max_attempts,
            )
            .values(
                status=StepStatus.FAILED.value,
                error=_p("error"),
                lease_expires_at=sa.null(),
                wake_at=sa.null(),
                updated_at=now,
            )
        )
        self.expire_attempt = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), A.c.attempt == _p("attempt"))
            .values(status=AttemptStatus.LEASE_EXPIRED.value, error=_p("error"), finished_at=now)
        )
        self.mark_scheduled = (
            sa.update(S)
            .where(
                S.c.id.in_(sa.bindparam("p_ids", expanding=True)),
                sa.or_(
                    _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
                    sa.and_(S.c.status == StepStatus.FAILED.value, S.c.wake_at.is_not(None)),
                ),
            )
            .values(
                status=sa.case(
                    (S.c.status == StepStatus.PENDING.value, StepStatus.SCHEDULED.value),
                    else_=S.c.status,
                ),
                scheduled_at=now,
            )
        )

    def _pass_writes(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """What a pass writes, on its 'now'."""
        not_terminal = _not_terminal(R)
        self.resolve = (
            sa.update(S)
            .where(S.c.id == _p("id"), sa.not_(_settled(S)))
            .values(
                status=_p("status"),
                result=_p("result"),
                error=_p("error"),
                lease_expires_at=sa.null(),
                wake_at=sa.null(),
                updated_at=at,
            )
        )
        self.resolve_attempt = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), A.c.attempt == _p("attempt"))
            .values(status=_p("status"), result=_p("result"), error=_p("error"), finished_at=at)
        )
        self.redispatch = (
            sa.update(S)
            .where(S.c.id.in_(sa.bindparam("p_ids", expanding=True)))
            .values(scheduled_at=at)
        )
        self.cancel_child = (
            sa.update(R)
            .where(R.c.id == _p("id"), not_terminal, R.c.cancel_requested == sa.false())
            .values(cancel_requested=True, version=R.c.version + 1, updated_at=at)
        )
        pass_values = _run_pass_values(at)
        self.run_pass = sa.update(R).where(R.c.id == _p("id")).values(**pass_values)
        self.run_end = (
            sa.update(R)
            .where(R.c.id == _p("id"))
            .values(
                **{**pass_values, "wake_at": sa.null()},
                status=_p("status"),
                output=_p("output"),
                error=_p("error"),
            )
        )
        self.settle_parent_step = (
            sa.update(S)
            .where(
                S.c.id == _p("id"),
                S.c.run_id == _p("parent"),
                S.c.status == StepStatus.RUNNING.value,
                S.c.child_run_id == _p("child"),
            )
            .values(
                status=_p("status"),
                result=_p("result"),
                error=_p("error"),
                wake_at=sa.null(),
                updated_at=at,
            )
        )
        current_attempt = sa.select(S.c.attempt).where(S.c.id == _p("id")).scalar_subquery()
        self.settle_parent_attempt = (
            sa.update(A)
            .where(A.c.step_id == _p("id"), A.c.attempt == current_attempt)
            .values(status=_p("status"), result=_p("result"), error=_p("error"), finished_at=at)
        )
        self.touch_parent = (
            sa.update(R)
            .where(R.c.id == _p("id"), not_terminal)
            .values(version=R.c.version + 1, updated_at=at)
        )

    def _sweep(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """The sweep's bookkeeping and its queries: each an index range scan."""
        not_terminal = _not_terminal(R)
        self.note_swept = (
            sa.update(R)
            .where(
                R.c.id == _p("id"),
                not_terminal,
                sa.or_(R.c.next_sweep_at.is_(None), R.c.next_sweep_at <= now),
            )
            .values(
                next_sweep_at=now + _sweep_backoff(R.c.sweep_count), sweep_count=R.c.sweep_count + 1
            )
        )
        # the per-step backoff, written on every step a sweep read (and acted on):
        # it leaves the sweep's ranges until then, and comes back behind the rest
        self.note_steps_swept = (
            sa.update(S)
            .where(S.c.id.in_(sa.bindparam("p_ids", expanding=True)))
            .values(
                next_sweep_at=now + _sweep_backoff(S.c.sweep_count), sweep_count=S.c.sweep_count + 1
            )
        )

        # --- sweep: each an index range scan, oldest first, limited ----------
        # 'now' as an uncorrelated scalar subquery: PostgreSQL's clock_timestamp()
        # is volatile, so compared directly it could only filter rows, never
        # bound an index range; a subquery is evaluated once (an InitPlan) and
        # its value can.
        now = sa.select(now).scalar_subquery()
        running = S.c.status == StepStatus.RUNNING.value
        fresh = S.c.next_sweep_at == 0  # never re-sent: by its own time
        # re-sent, its backoff over: by its end, behind the rest
        backed_off = sa.and_(S.c.next_sweep_at > 0, S.c.next_sweep_at <= now)
        # Two ranges of one index: leases that lapsed, and leases set further
        # ahead than any queue grants (an edited row, a clock gone wrong),
        # which count as lapsed at that bound. A NULL bound finds none.
        self.lapsed = _union_oldest(
            [
                sa.select(S)
                .where(
                    running, fresh, S.c.lease_expires_at.is_not(None), S.c.lease_expires_at <= now
                )
                .order_by(S.c.lease_expires_at),
                sa.select(S)
                .where(running, fresh, S.c.lease_expires_at > now + _p("bound_ms", sa.BigInteger()))
                .order_by(S.c.lease_expires_at.desc()),
                sa.select(S)
                .where(running, backed_off, _lapsed(S, now, _p("bound_ms", sa.BigInteger())))
                .order_by(S.c.next_sweep_at),
            ],
            lambda c: sa.func.coalesce(sa.func.nullif(c.next_sweep_at, 0), c.lease_expires_at),
        )
        cutoff = now - _p("older_ms", sa.BigInteger())
        undispatched: list[sa.Select[Any]] = []
        for status in (StepStatus.SCHEDULED.value, StepStatus.PENDING.value):
            task = (S.c.status == status, S.c.kind == StepKind.TASK.value)
            undispatched.append(
                sa.select(S)
                .where(*task, fresh, S.c.scheduled_at <= cutoff)
                .order_by(S.c.scheduled_at)
            )
            undispatched.append(
                sa.select(S)
                .where(*task, fresh, S.c.scheduled_at.is_(None), S.c.created_at <= cutoff)
                .order_by(S.c.created_at)
            )
            undispatched.append(
                sa.select(S)
                .where(
                    *task,
                    backed_off,
                    sa.func.coalesce(S.c.scheduled_at, S.c.created_at) <= cutoff,
                )
                .order_by(S.c.next_sweep_at)
            )
        self.undispatched = _union_oldest(
            undispatched,
            lambda c: sa.func.coalesce(
                sa.func.nullif(c.next_sweep_at, 0), c.scheduled_at, c.created_at
            ),
        )
        sent_at = sa.func.coalesce(S.c.scheduled_at, S.c.created_at)
        self.waiting_by_queue = (
            sa.select(
                S.c.queue,
                sa.func.count().label("steps"),
                (now - sa.func.min(sent_at)).label("oldest_ms"),
            )
            .where(
                _status_in(S, StepStatus.PENDING, StepStatus.SCHEDULED),
                S.c.kind == StepKind.TASK.value,
                sent_at <= cutoff,
            )
            .group_by(S.c.queue)
            .order_by(sa.func.count().desc(), sa.func.min(sent_at))
        )
        due = (S.c.wake_at.is_not(None), S.c.wake_at <= now)
        self.due = _union_oldest(
            [
                member
                for status in (StepStatus.SCHEDULED.value, StepStatus.FAILED.value)
                for member in (
                    sa.select(S).where(S.c.status == status, fresh, *due).order_by(S.c.wake_at),
                    sa.select(S)
                    .where(S.c.status == status, backed_off, *due)
                    .order_by(S.c.next_sweep_at),
                )
            ],
            lambda c: sa.func.coalesce(sa.func.nullif(c.next_sweep_at, 0), c.wake_at),
        )
        in_flight = sa.exists().where(S.c.run_id == R.c.id, _unsettled(S))
        self.idle = (
            sa.select(R)
            .where(
                R.c.status == RunStatus.RUNNING.value,
                R.c.updated_at <= now - _p("idle_ms", sa.BigInteger()),
                sa.not_(in_flight),
            )
            .order_by(R.c.updated_at)
            .limit(_p("limit", sa.Integer()))
        )

    def _in_flight(self) -> None:
        """The deploy check's bulk read: runs not settled, a page at a time by
        id, then the steps and signals of a whole page in one statement each."""
        self.in_flight_runs = (
            sa.select(R)
            .where(_not_terminal(R), R.c.id > _p("after"))
            .order_by(R.c.id)
            .limit(_p("limit", sa.Integer()))
        )
        page: sa.BindParameter[Any] = sa.bindparam("p_ids", expanding=True)
        self.steps_of_runs = sa.select(S).where(S.c.run_id.in_(page)).order_by(S.c.run_id, S.c.seq)
        self.signals_of_runs = sa.select(G.c.run_id, G.c.name, G.c.payload).where(
            G.c.run_id.in_(page)
        )

    @functools.lru_cache(maxsize=32)  # noqa: B019 - built once per dialect, kept for good
    def list_runs(self, status: bool, workflow: bool, since: bool, until: bool) -> sa.Select[Any]:
        """One statement per combination of filters, built on first use."""
        q = sa.select(R)
        if status:
            q = q.where(R.c.status == _p("status"))
        if workflow:
            q = q.where(R.c.workflow == _p("workflow"))
        if since:
            q = q.where(R.c.created_at >= _p("since", sa.BigInteger()))
        if until:
            q = q.where(R.c.created_at < _p("until", sa.BigInteger()))
        return (
            q.order_by(R.c.created_at.desc(), R.c.id.desc())
            .limit(_p("limit", sa.Integer()))
            .offset(_p("offset", sa.Integer()))
        )

    @functools.lru_cache(maxsize=8)  # noqa: B019 - built once per dialect, kept for good
    def count_runs(self, workflow: bool, since: bool, until: bool) -> sa.Select[Any]:
        """Runs per status, with ``list_runs``'s filters but the status."""
        q = sa.select(R.c.status, sa.func.count()).group_by(R.c.status)
        if workflow:
            q = q.where(R.c.workflow == _p("workflow"))
        if since:
            q = q.where(R.c.created_at >= _p("since", sa.BigInteger()))
        if until:
            q = q.where(R.c.created_at < _p("until", sa.BigInteger()))
        return q
