"""The one-write pass, for the SQL stores that can write a plan in one go.

A pass with an outcome reads the run unlocked (or takes the view the engine
hands it: its claim's, or the pass before's); the engine decides and plans with
no transaction open, and a plan of the outcome, the run and at most one new
step (beside a few settled values) is written as one version-checked write:
the version the read saw pins the run, so a pass or a signal that landed in
between makes the write change nothing (:class:`~pikku_celery.model.plan.Moved`).
Any other plan is the portable locked write's. A dialect supplies the write
(:meth:`OptimisticSQLStore._pass_write`): PostgreSQL one statement of
data-modifying CTEs, MySQL/MariaDB one batch and its COMMIT. A new run and
its first plan are one write the same way (:meth:`OptimisticSQLStore.write_start`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..errors import RunNotFoundError, StoreError
from ..model.changes import run_created
from ..model.plan import PassView, PassWrite, StepRow
from ..model.values import (
    JSON,
    AdvanceResult,
    NewRun,
    RunView,
)
from ..payload import dumps, read_stored
from .rows import (
    SIGNAL_PLACE,
    attempt_row_params,
    outcome_params,
    run_from,
    run_params,
    step_from,
    step_params,
)
from .sql import SQLWorkflowStore

# (outcome kind or None, a new step, the run ends, the new step claimed
# eagerly, how many settled value steps are written beside it)
PassShape = tuple[str | None, bool, bool, bool, int]

MAX_PASS_VALUES = 4
"""Settled value steps (``ctx.set_event``, ``ctx.now``, patch markers) one
optimistic write takes beside its one new step; a pass with more is locked."""


class OptimisticSQLStore(SQLWorkflowStore):
    """A SQL store with the optimistic pass."""

    @property
    def writes_passes(self) -> bool:
        """Whether passes take the optimistic write here (else all are locked)."""
        return True

    def _pass_write(self, shape: PassShape, params: dict[str, Any]) -> tuple[bool, bool]:
        """The pass of ``shape`` written in one go: (pinned, fenced). (False,
        _): the version moved and nothing was written; (True, False): the
        outcome was superseded and nothing was written; (True, True): landed."""
        raise NotImplementedError

    def _end_params(
        self, run_id: str, status: str, output: str | None, error: str | None
    ) -> dict[str, Any]:
        """What a dialect's write of a pass that ends the run needs besides."""
        return {}

    def _read_pass_view(self, run_id: str) -> Sequence[Any]:
        """The run's head and steps (``pass_view``), unlocked."""
        with self._one() as conn:
            return conn.execute(self.statements.pass_view, {"p_id": run_id}).all()

    def _read_signals(self, run_id: str) -> dict[str, JSON]:
        with self._one() as conn:
            rows = conn.execute(self.statements.signals_of_run, {"p_id": run_id})
            return {
                name: read_stored(payload, SIGNAL_PLACE, run_id, name) for name, payload in rows
            }

    # --- a new run with its first pass -------------------------------------
    def start_view(self, new: NewRun, now: int) -> PassView | None:
        """The run as created, for a first pass written with it: "now" is the
        database's clock as the engine last read it, so nothing is read
        first. None with an idempotency key (the run may exist already)."""
        if not self.writes_passes or new.idempotency_key is not None:
            return None
        text = dumps(new.input, f"workflow {new.workflow!r}", "input")
        run = run_created(new, json.loads(text), now)
        return PassView(RunView(run=run, steps=[], signals={}, now=now), len(text), "created")

    def write_start(self, new: NewRun, read: PassView, plan: PassWrite) -> AdvanceResult | None:
        """The run and its first pass in one write when the pass records one
        step (the usual start); otherwise the run is only created."""
        rows = _one_write_rows(plan)
        if rows is None or len(rows[1]) != 1 or plan.ends or plan.eager is not None:
            return None
        values, [first] = rows
        now, text = plan.now, dumps(new.input, f"workflow {new.workflow!r}", "input")
        params = {f"r_{k}": v for k, v in run_params(new, text, now).items()}
        params.update(r_created_at=now, r_updated_at=now)
        params.update(r_version=plan.run.version, r_wake_at=plan.run.wake_at)
        params.update(_row_params("n_", first))
        for i, value in enumerate(values):
            params.update(_row_params(f"v{i}_", value))
        try:
            self._start_write(params, len(values))
        except (sa.exc.DataError, sa.exc.IntegrityError) as exc:
            self.create_run(new)
            first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else ""
            raise StoreError(
                f"the database refused what the first pass of run {new.id} decided: {first_line}"
            ) from exc
        return plan.landed([], False)

    def _start_write(self, params: dict[str, Any], values: int = 0) -> None:
        """The new run (parameters ``r_*``), its first step (``n_*``) and
        ``values`` settled value steps (``v0_*``...) in one write."""
        raise NotImplementedError

    # --- the orchestration pass ---------------------------------------------
    def read_pass(
        self, run_id: str, known: PassView | None = None, optimistic: bool = False
    ) -> PassView:
        """The view the engine hands (a claim's, a run it just created)
        while it is good, else one unlocked read for an optimistic pass;
        any other pass reads as the locked pass does."""
        if not self.writes_passes:
            return super().read_pass(run_id)
        kept = None if known is None else known.kept(run_id)
        if kept is not None:
            return kept
        if not optimistic:
            return super().read_pass(run_id)
        rows = self._read_pass_view(run_id)
        if not rows:
            raise RunNotFoundError(f"no workflow run {run_id!r}")
        head = rows[0]
        steps = [step_from(r) for r in rows if r.id is not None]
        signals = self._read_signals(run_id) if head.has_signals else {}
        run, now = run_from(head, "r_"), int(head.db_now)
        view = RunView(run=run, steps=steps, signals=signals, now=now, reread=True)
        return PassView(view, len(head.r_input or ""), "kept")

    def _write(self, read: PassView, plan: PassWrite) -> AdvanceResult | None:
        """The one write when the read allows it and the plan is one it
        takes (:meth:`_write_one`); else the locked write. A plan the one
        write does not take, made on a kept view, writes nothing: the
        engine reads and decides again on the store's clock."""
        rows = None if read.source == "read" else _one_write_rows(plan)
        if rows is not None:
            return self._write_one(read, plan, *rows)
        if read.source == "kept":
            return None
        return self._write_locked(plan)

    def _write_one(
        self, read: PassView, plan: PassWrite, values: list[StepRow], others: list[StepRow]
    ) -> AdvanceResult | None:
        """The hot path: the whole pass as one version-checked write
        (:meth:`_pass_write`): one commit. None, with nothing written, when
        the version moved (another pass or a signal came first)."""
        run_id, written = plan.run.id, plan.outcome
        params: dict[str, Any] = {"p_now": plan.now}
        if written is not None:
            params = outcome_params(written, plan.now)
        params.update(p_run=run_id, p_version=plan.version, p_wake_at=plan.run.wake_at)
        if plan.ends:
            status = plan.run.status.value
            params.update(p_run_status=status, p_output=plan.output, p_run_error=plan.error)
            params.update(self._end_params(run_id, status, plan.output, plan.error))
        for i, value in enumerate(values):
            params.update(_row_params(f"v{i}_", value))
        for other in others:
            params.update(_row_params("n_", other))
            if other.attempt is not None:
                attempt = attempt_row_params(other.attempt, run_id)
                params.update({f"a_{k}": v for k, v in attempt.items()})
        kind = None if written is None else written.kind
        shape = (kind, bool(others), plan.ends, plan.eager is not None, len(values))
        pinned, fenced = self._pass_write(shape, params)
        if not pinned:
            return None
        if not fenced:
            assert written is not None  # a pass without one is fenced by its pin
            done = written.outcome
            raise self._superseded(done.step_id, done.attempt, done.claim_id, run_id)
        return plan.landed([], False)


def _one_write_rows(plan: PassWrite) -> tuple[list[StepRow], list[StepRow]] | None:
    """The new rows of a plan the one write takes (its settled values, its
    other step if any); None when the locked pass must write it."""
    values = [row for row in plan.inserts if row.settled_value]
    others = [row for row in plan.inserts if not row.settled_value]
    if (
        plan.decision is None
        or plan.resolved
        or plan.redispatch
        or plan.cancel_children
        or plan.close_open is not None  # a cancelled run's open steps close
        or len(others) > 1
        or len(values) > MAX_PASS_VALUES
        or any(row.child is not None for row in plan.inserts)
        or (plan.ends and plan.run.parent_run_id is not None)
        or plan.successor is not None  # continue_as_new inserts a run
    ):
        return None
    return values, others


def _row_params(prefix: str, row: StepRow) -> dict[str, Any]:
    """A new step's insert parameters, named with ``prefix``."""
    params = step_params(row.step, row.args, row.kwargs, row.value)
    return {f"{prefix}{k}": v for k, v in params.items()}
