"""The terms the store's statements are written in: tables, parameters, conditions.

Shared by every family of statements (:mod:`.statements_runs`,
:mod:`.statements_claims`, :mod:`.statements_pass`, :mod:`.statements_sweep`)
and the dialects' own (:mod:`.statements_postgres`, :mod:`.statements_mysql`),
so a condition such as "the step is settled" is spelled once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import AttemptStatus, RunStatus, StepStatus
from ..sql.schema import attempt_table, audit_table, run_table, signal_table, step_table
from .rules import SWEEP_BACKOFF_DOUBLINGS

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


def run_pinned(t: sa.Table) -> ColumnElement[bool]:
    """The row is of the run the caller names (``p_run``): what routes a
    statement to one shard where the tables are distributed by run, and
    what keeps a stale or forged message off another run's step."""
    return t.c.run_id == _p("run", ID_TYPE)


def _claim_matches() -> ColumnElement[bool]:
    """The write's claim is the step's current claim (a NULL claim: any)."""
    claim = _p("claim", CLAIM_TYPE)
    return sa.or_(claim.is_(None), S.c.claim_id == claim)


FENCE = (
    S.c.id == _p("id"),
    run_pinned(S),
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
        .where(A.c.step_id == _p("id"), run_pinned(A), A.c.attempt == _p("attempt"))
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
