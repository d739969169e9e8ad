"""The statements of runs and their steps: read, lock, create, cancel, reopen;
signals, the audit trail, the lists and counts people read, the deploy check's
bulk read.
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from ..model.values import AttemptStatus, RunStatus, StepKind, StepStatus
from ..sql.schema import NextAuditId
from ..sql.schema import run_key_table as K
from .statements_terms import (
    AU,
    A,
    G,
    R,
    S,
    _lit,
    _not_terminal,
    _p,
    _status_in,
    _union_oldest,
    run_pinned,
)

RUN_FILTERS = ("status", "workflow", "since", "until")
LIST_SHAPES = (*RUN_FILTERS, "before")
"""The shapes of ``list_runs``: its filters and the keyset cursor."""


def _run_filters(
    status: bool, workflow: bool, since: bool, until: bool, before: bool
) -> list[ColumnElement[bool]]:
    """The runs list's filters; ``before``: strictly before the cursor
    ``(p_before_at, p_before_id)``, bounded on ``created_at`` so an index
    range stops there."""
    found: list[ColumnElement[bool]] = []
    if status:
        found.append(R.c.status == _p("status"))
    if workflow:
        found.append(R.c.workflow == _p("workflow"))
    if since:
        found.append(R.c.created_at >= _p("since", sa.BigInteger()))
    if until:
        found.append(R.c.created_at < _p("until", sa.BigInteger()))
    if before:
        at = _p("before_at", sa.BigInteger())
        found += [R.c.created_at <= at, sa.or_(R.c.created_at < at, R.c.id < _p("before_id"))]
    return found


PAYLOADS = frozenset({"args", "kwargs", "result", "error", "route"})
"""A step's payload columns: what its outline leaves out."""


class RunStatements:
    """Runs, steps, signals and the audit trail; the runs list and its counts."""

    def _runs(self, now: ColumnElement[int], at: ColumnElement[int]) -> None:
        """Runs: read, lock, create, cancel, reopen; signals, the audit trail."""
        self._run_rows(at)
        self._run_keys(now)
        self._run_reopening(at)
        self._signals_and_audit(at)

    def _run_rows(self, at: ColumnElement[int]) -> None:
        """A run's row read, locked, inserted, cancelled, blocked, touched."""
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

    def _run_keys(self, now: ColumnElement[int]) -> None:
        """A start's idempotency key: its row written first (the start whose
        row goes in creates the run), and the run it names, by the key's
        primary key. The portable insert refuses a key already written (the
        store reads the winner's run after the rollback); PostgreSQL's and
        MySQL's do nothing instead, and the loser reads it in its transaction."""
        self.key_insert: sa.Insert = sa.insert(K).values(
            workflow=_p("workflow"), idempotency_key=_p("key"), run_id=_p("id"), created_at=now
        )
        self.key_run = sa.select(K.c.run_id).where(
            K.c.workflow == _p("workflow"), K.c.idempotency_key == _p("key")
        )

    def _run_reopening(self, at: ColumnElement[int]) -> None:
        """A failed run reopened (retry): its row, and its failed task steps."""
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

    def _signals_and_audit(self, at: ColumnElement[int]) -> None:
        """Signals, the audit trail, a person's search and the status counts."""
        self.signal_payload = sa.select(G.c.payload).where(
            G.c.run_id == _p("id"), G.c.name == _p("name")
        )
        self.signal_insert = sa.insert(G)
        self.signals_of_run = sa.select(G.c.name, G.c.payload).where(G.c.run_id == _p("id"))
        # For people (the run page, the command line), not the hot path.
        self.signals_in_order = self.signals_of_run.order_by(G.c.created_at, G.c.name)
        # A person's search, bounded by the limit: ix_pikku_run_key_created
        # (the key table's primary key leads with the workflow).
        self.runs_with_key = (
            sa.select(R)
            .where(R.c.idempotency_key == _p("key"))
            .order_by(R.c.created_at.desc(), R.c.id.desc())
            .limit(_p("limit", sa.Integer()))
        )
        # The audit trail: appended at the transaction's clock, read per run.
        self.audit_insert = sa.insert(AU).values(
            id=NextAuditId(),
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
        # A step is addressed by its id and its run (``p_run``): routed to the
        # run's shard, and a step of another run is not there.
        self.step_get = sa.select(S).where(S.c.id == _p("id"), run_pinned(S))
        self.step_task_name = sa.select(S.c.task_name).where(S.c.id == _p("id"), run_pinned(S))
        # The one read by step id alone: the run of a step whose caller did
        # not name it, read before the pinned statement.
        self.step_run_of = sa.select(S.c.run_id).where(S.c.id == _p("id"))
        self.steps_of_run = sa.select(S).where(S.c.run_id == _p("id")).order_by(S.c.seq)
        # The steps without their payloads: a long history's outline.
        self.step_outlines_of_run = (
            sa.select(*(sa.null().label(c.name) if c.name in PAYLOADS else c for c in S.c))
            .where(S.c.run_id == _p("id"))
            .order_by(S.c.seq)
        )
        # A page of a long history: a range of the (run_id, seq) index.
        self.steps_page_of_run = (
            sa.select(S)
            .where(S.c.run_id == _p("id"), S.c.seq > _p("after_seq", sa.Integer()))
            .order_by(S.c.seq)
            .limit(_p("limit", sa.Integer()))
        )
        # A run's progress events (value steps ``event:<key>#<n>``); ``p_like``
        # is a LIKE pattern escaped with "/" (all keys, or one key's).
        self.event_steps_of_run = (
            sa.select(S)
            .where(
                S.c.run_id == _p("id"),
                S.c.kind == StepKind.VALUE.value,
                S.c.name.like(_p("like"), escape="/"),
            )
            .order_by(S.c.seq)
        )
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
            .where(S.c.run_id == _p("id"), A.c.run_id == _p("id"))  # routed by run (Citus)
            .order_by(A.c.started_at, A.c.step_id, A.c.attempt)
        )
        # the attempts of one page of steps: through the same index range
        self.attempts_page_of_run = (
            sa.select(A)
            .join(S, S.c.id == A.c.step_id)
            .where(
                S.c.run_id == _p("id"),
                A.c.run_id == _p("id"),
                S.c.seq > _p("after_seq", sa.Integer()),
                S.c.seq <= _p("through_seq", sa.Integer()),
            )
            .order_by(A.c.started_at, A.c.step_id, A.c.attempt)
        )
        self.step_insert = sa.insert(S)
        self.attempt_insert = sa.insert(A)

    def _in_flight(self) -> None:
        """The deploy check's bulk read: runs not settled, a page at a time by
        id, then the steps and signals of a whole page in one statement each."""
        # one range of the live-runs index per live status, merged by id
        self.in_flight_runs = _union_oldest(
            [
                sa.select(R).where(R.c.status == s.value, R.c.id > _p("after")).order_by(R.c.id)
                for s in RunStatus
                if not s.terminal
            ],
            lambda c: c.id,
        )
        page: sa.BindParameter[Any] = sa.bindparam("p_ids", expanding=True)
        self.steps_of_runs = sa.select(S).where(S.c.run_id.in_(page)).order_by(S.c.run_id, S.c.seq)
        self.signals_of_runs = sa.select(G.c.run_id, G.c.name, G.c.payload).where(
            G.c.run_id.in_(page)
        )

    @functools.lru_cache(maxsize=64)  # noqa: B019 - built once per dialect, kept for good
    def list_runs(
        self, status: bool, workflow: bool, since: bool, until: bool, before: bool = False
    ) -> sa.Select[Any]:
        """One statement per combination of filters, built on first use.

        Newest first by ``(created_at, id)``; ``before`` starts after a page's
        cursor (``p_before_at``, ``p_before_id``). Without a status filter it
        is one index range per status, merged: each range is walked only as
        far as the page needs, whatever the table holds.
        """
        limit = _p("limit", sa.Integer())
        offset = _p("offset", sa.Integer())
        order = (R.c.created_at.desc(), R.c.id.desc())
        if status:
            q = sa.select(R).where(*_run_filters(True, workflow, since, until, before))
            return q.order_by(*order).limit(limit).offset(offset)
        members = [
            sa.select(R)
            .where(R.c.status == s.value, *_run_filters(False, workflow, since, until, before))
            .order_by(*order)
            .limit(_p("reach", sa.Integer()))  # limit + offset: what the page reaches
            .subquery()
            for s in RunStatus
        ]
        union = sa.union_all(*[sa.select(m) for m in members]).subquery("newest")
        return (
            sa.select(union)
            .order_by(union.c.created_at.desc(), union.c.id.desc())
            .limit(limit)
            .offset(offset)
        )

    @functools.lru_cache(maxsize=8)  # noqa: B019 - built once per dialect, kept for good
    def count_runs(self, workflow: bool, since: bool, until: bool) -> sa.Select[Any]:
        """Runs per status, with ``list_runs``'s filters but the status (every
        matching row counted: the metrics' gauge; the run page counts capped)."""
        q = sa.select(R.c.status, sa.func.count()).group_by(R.c.status)
        return q.where(*_run_filters(False, workflow, since, until, False))

    @functools.lru_cache(maxsize=8)  # noqa: B019 - built once per dialect, kept for good
    def count_runs_capped(self, workflow: bool, since: bool, until: bool) -> sa.CompoundSelect[Any]:
        """Runs per status as ``count_runs``, each count stopping at ``p_cap``
        rows: one index range per status, never read further than the cap."""
        cap = _p("cap", sa.Integer())
        members = []
        for s in RunStatus:
            found = (  # the newest: an index range read backwards, never a table scan
                sa.select(R.c.id)
                .where(R.c.status == s.value, *_run_filters(False, workflow, since, until, False))
                .order_by(R.c.created_at.desc(), R.c.id.desc())
                .limit(cap)
                .subquery()
            )
            count = sa.select(_lit(s.value).label("status"), sa.func.count().label("n"))
            members.append(count.select_from(found))
        return sa.union_all(*members)
