"""The optimistic pass, for the SQL stores that can write a pass in one go.

A pass with an outcome reads the run unlocked (or takes the view this
process kept of it: :mod:`.kept_views`), decides with no transaction open,
and writes the outcome, the run and its one new step as one version-checked
write: the version the read saw pins the run, so a pass or a signal that
landed in between makes the write change nothing, and the portable locked
pass (:meth:`SQLWorkflowStore._advance`) takes the pass instead. A dialect
supplies the write (:meth:`OptimisticSQLStore._pass_write`): PostgreSQL one
statement of data-modifying CTEs, MySQL/MariaDB one batch and its COMMIT. A
new run and its first pass are one write the same way (``start_run``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..errors import RunNotFoundError, StoreError
from ..payload import dumps, loads, read_stored
from .base import Decide
from .changes import (
    eager_claim_of,
    prepare_outcome,
    run_after_pass,
    run_created,
    step_created,
    step_created_claimed,
)
from .kept_views import (
    FRESH_RUN_MS,
    ClaimView,
    DatabaseClock,
    FirstPass,
    Passed,
    PassedRuns,
    remember,
)
from .model import (
    EAGER,
    JSON,
    AdvanceResult,
    AttemptStatus,
    NewRun,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)
from .rows import SIGNAL_PLACE, attempt_params, run_from, run_params, step_from, step_params
from .rules import EncodedDecision, encode_decision
from .sql import SQLWorkflowStore

# (outcome kind or None, a new step, the run ends, the new step claimed eagerly)
PassShape = tuple[str | None, bool, bool, bool]


class OptimisticSQLStore(SQLWorkflowStore):
    """A SQL store with the optimistic pass and the views it keeps."""

    def _setup(self) -> None:
        self._claim_views: OrderedDict[tuple[str, int], ClaimView] = OrderedDict()
        # Runs just created, by the creating thread: the first pass that
        # thread takes needs no read (the engine's start()).
        self._fresh_runs: OrderedDict[str, tuple[int, ClaimView]] = OrderedDict()
        # The run's steps as this store's last optimistic pass left them, by
        # the step that pass scheduled: that step's claim then needs no read
        # of them while the version still matches.
        self._passed = PassedRuns()
        self._clock = DatabaseClock()

    @property
    def writes_passes(self) -> bool:
        """Whether passes take the optimistic write here (else all are locked)."""
        return True

    def _pass_write(self, shape: PassShape, params: dict[str, Any]) -> tuple[bool, bool]:
        """The pass of ``shape`` written in one go: (pinned, fenced). (False,
        _): the version moved and nothing was written; (True, False): the
        outcome was superseded and nothing was written; (True, True): landed."""
        raise NotImplementedError

    def _end_params(self, run_id: str, status: str, encoded: EncodedDecision) -> dict[str, Any]:
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

    def _created(self, run: RunState, input_size: int) -> None:
        self._clock.saw(run.updated_at)
        fresh = ClaimView(
            run,
            [],
            run.updated_at,
            False,
            time.monotonic(),
            run.updated_at + FRESH_RUN_MS,
            input_size,
        )
        remember(self._fresh_runs, run.id, (threading.get_ident(), fresh))

    def _forget_created(self, run_id: str) -> None:
        self._fresh_runs.pop(run_id, None)

    def _created_here(self, run_id: str) -> bool:
        """Whether this thread created ``run_id`` and has not advanced it yet."""
        return self._fresh_runs.get(run_id, (0, None))[0] == threading.get_ident()

    # --- a new run with its first pass -------------------------------------
    def start_run(self, new: NewRun, decide: Decide) -> AdvanceResult | None:
        """A new run and its first pass in one write, when that pass
        records one step (the usual start): "now" is the database's clock
        as last read here (:class:`DatabaseClock`), so nothing is read first.
        Otherwise (no recent reading, an idempotency key, another decision)
        the run is only created, and the caller takes the pass."""
        now = self._clock.now()
        if not self.writes_passes or now is None or new.idempotency_key is not None:
            self.create_run(new)
            return None
        text = dumps(new.input, f"workflow {new.workflow!r}", "input")
        run = run_created(new, json.loads(text), now)
        try:
            decision = decide(RunView(run=run, steps=[], signals={}, now=now))
            encoded = encode_decision(run, {}, decision)
        except BaseException:
            self.create_run(new)  # so that the engine can record the failure
            raise
        if (
            len(encoded.steps) != 1
            or encoded.steps[0].child_input is not None
            or decision.run_status is not None
            or decision.redispatch
            or decision.eager is not None
        ):
            self.create_run(new)
            return None
        passed = run_after_pass(run, decision, None, None, now)
        [first] = encoded.steps
        step = step_created(run, first, now)
        params = {f"r_{k}": v for k, v in run_params(new, text).items()}
        params.update(
            r_created_at=now, r_updated_at=now, r_version=passed.version, r_wake_at=passed.wake_at
        )
        row = step_params(
            step, encoded.steps[0].args, encoded.steps[0].kwargs, encoded.steps[0].value
        )
        params.update({f"n_{k}": v for k, v in row.items()})
        try:
            self._start_write(params)
        except (sa.exc.DataError, sa.exc.IntegrityError) as exc:
            self.create_run(new)
            first_line = str(exc.orig).strip().splitlines()[0] if exc.orig else ""
            raise StoreError(
                f"the database refused what the first pass of run {run.id} decided: {first_line}"
            ) from exc
        publish = (
            [step] if step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED else []
        )
        if publish:
            self._passed.put(step.id, Passed(passed, [step], len(text), False))
        return AdvanceResult(run=passed, steps=publish, decision=decision)

    def _start_write(self, params: dict[str, Any]) -> None:
        """The new run (parameters ``r_*``) and its first step (``n_*``) in one write."""
        raise NotImplementedError

    # --- the orchestration pass ---------------------------------------------
    def _pass(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        """A pass with an outcome first tries the optimistic path; every other
        pass, and any the optimistic path hands back, is the locked pass."""
        done = first = None
        if self.writes_passes:
            if outcome is not None:
                done = self._advance_optimistic(run_id, outcome, decide)
            elif self._created_here(run_id):
                first = FirstPass(decide)
                done = self._advance_optimistic(run_id, outcome, first.decide)
        if done is not None:
            return done
        return self._locked_pass(run_id, outcome, decide, first)

    def _locked_pass(
        self, run_id: str, outcome: StepOutcome | None, decide: Decide, first: FirstPass | None
    ) -> AdvanceResult:
        return self._advance(run_id, outcome, decide, first)

    def _advance_optimistic(
        self, run_id: str, outcome: StepOutcome | None, decide: Decide
    ) -> AdvanceResult | None:
        """The hot path: one unlocked read (none from a kept view), then the
        whole pass as one version-checked write (:meth:`_pass_write`): one
        commit.

        None, with nothing written, when the locked pass must do it instead:
        the version moved (another pass or a signal came first), the run has
        ended, or the decision is not a plain sequential step (fan-out, child
        runs, resolutions...). The locked pass then reads and decides afresh,
        so ``decide`` must be pure (the replay is).
        """
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
            rows = self._read_pass_view(run_id)
            if not rows:
                raise RunNotFoundError(f"no workflow run {run_id!r}")
            head = rows[0]
            run = run_from(head, "r_")
            now, input_size = int(head.db_now), len(head.r_input or "")
            self._clock.saw(now)
            steps = [step_from(r) for r in rows if r.id is not None]
            has_signals = bool(head.has_signals)
        if run.status.terminal:
            return None
        kind: str | None = None
        written: dict[str, Any] = {"p_now": now}
        if outcome is not None:
            prepared = prepare_outcome(steps, outcome, now)
            kind, steps, written = prepared.kind, prepared.steps, prepared.params
        signals: dict[str, JSON] = {}
        if has_signals:
            signals = self._read_signals(run_id)
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
        new_run = run_after_pass(run, decision, loads(encoded.output), loads(encoded.error), now)
        if ends:
            assert decision.run_status is not None
            params.update(
                p_run_status=decision.run_status.value,
                p_output=encoded.output,
                p_run_error=encoded.error,
                **self._end_params(run.id, decision.run_status.value, encoded),
            )
        publish: list[StepState] = []
        eager = None
        for enc in encoded.steps:
            step = step_created(run, enc, now)
            claim = eager_claim_of(decision.eager, enc.new)
            if claim is not None:
                step = eager = step_created_claimed(step, claim, now)
                attempt = attempt_params(step, AttemptStatus.RUNNING, EAGER, now, claim.delivery)
                params.update({f"a_{k}": v for k, v in attempt.items()})
            row = step_params(step, enc.args, enc.kwargs, enc.value)
            params.update({f"n_{k}": v for k, v in row.items()})
            if eager is None and step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED:
                publish.append(step)
        shape = (kind, bool(encoded.steps), ends, eager is not None)
        pinned, fenced = self._pass_write(shape, params)
        if not pinned:
            return None
        if not fenced:
            assert outcome is not None  # a pass without one is fenced by its pin
            raise self._superseded(outcome.step_id, outcome.attempt, outcome.claim_id)
        if eager is not None:
            # The eager step's own pass (in this process, next) needs no read.
            self._keep_view(eager, new_run, [*steps, eager], now, has_signals, input_size)
        elif len(publish) == 1 and len(encoded.steps) == 1:
            left = Passed(new_run, [*steps, publish[0]], input_size, has_signals)
            self._passed.put(publish[0].id, left)
        return AdvanceResult(run=new_run, steps=publish, decision=decision, eager=eager)

    def _keep_view(
        self,
        step: StepState,
        run: RunState | None,
        steps: list[StepState],
        db_now: int,
        has_signals: bool,
        input_size: int,
    ) -> None:
        """The run as this process knows it at ``step``'s claim (a claim's
        read, or the pass that wrote the claim or scheduled the step), kept
        for the pass of that attempt while its first lease is live. ``run``
        None: nothing to keep, and a view an earlier claim of this attempt
        kept is dropped (a claim the database lost, taken again: not this
        claim's)."""
        key = (step.id, step.attempt)
        if run is None:
            self._claim_views.pop(key, None)
            return
        view = ClaimView(
            run,
            steps,
            db_now,
            has_signals,
            time.monotonic(),
            int(step.lease_expires_at or 0),
            input_size,
        )
        remember(self._claim_views, key, view)
