"""The workflow store on PostgreSQL: one round trip for each hot operation.

Only what PostgreSQL does in fewer round trips than the portable store
(:mod:`.sql`): single statements in autocommit, on libpq's prepared
statements with psycopg (:class:`~pikku_celery.sql.runner.LibpqRunner`); a
claim that also reads what its pass needs (:mod:`.kept_views`); a pass with
an outcome as one unlocked read and one version-checked statement (the
optimistic pass; anything more takes the portable locked pass); a run's end
announced with NOTIFY for ``RunHandle.wait``.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa

from ..errors import RunNotFoundError, StoreError
from ..payload import dumps, loads
from ..sql.runner import LibpqRunner, Runner, SQLAlchemyRunner
from ..sql.settle import SETTLED_CHANNEL, SettleListener, settle_notice
from .base import Decide, SettleWatch
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
from .rows import STEP_COLUMNS, attempt_params, run_from, run_params, step_from, step_params
from .rules import encode_decision
from .sql import SQLWorkflowStore
from .statements_postgres import CLAIM_VIEW_STEPS, PostgresStatements


@functools.cache
def _statements() -> PostgresStatements:
    return PostgresStatements()


class PostgresWorkflowStore(SQLWorkflowStore):
    """The SQL store on PostgreSQL (``SQLWorkflowStore(engine)`` picks it)."""

    creates_tables = False
    statements: PostgresStatements

    def _setup(self) -> None:
        self._settle: SettleListener | None = None
        self._claim_views: OrderedDict[tuple[str, int], ClaimView] = OrderedDict()
        # Runs just created, by the creating thread: the first pass that
        # thread takes needs no read (the engine's start()).
        self._fresh_runs: OrderedDict[str, tuple[int, ClaimView]] = OrderedDict()
        # The run's steps as this store's last optimistic pass left them, by
        # the step that pass scheduled: that step's claim then reads only the
        # run row, and takes the steps from here if the version still matches.
        self._passed = PassedRuns()
        self._clock = DatabaseClock()

    def _make_statements(self) -> PostgresStatements:
        return _statements()

    def _single_statement_engine(self) -> sa.Engine:
        # Single statements in autocommit save the BEGIN and COMMIT round
        # trips (psycopg's autocommit switch is local, no round trip).
        return self._engine.execution_options(isolation_level="AUTOCOMMIT")

    def _make_runner(self) -> Runner:
        fallback = SQLAlchemyRunner(self._single.begin)
        if self._engine.dialect.driver == "psycopg":
            return LibpqRunner(self._engine, fallback)
        return fallback

    # --- runs ----------------------------------------------------------------
    def _insert_run(
        self, new: NewRun, key: dict[str, Any], params: dict[str, Any]
    ) -> RunState | tuple[int, int]:
        st = self.statements
        if new.idempotency_key is None:
            [made] = self.runner.rows(st.run_insert_returning, params)
            return made.created_at, made.updated_at
        with self._one() as conn:
            row = conn.execute(st.run_by_key, key).first()
            if row is not None:
                return run_from(row)
            created, updated = conn.execute(st.run_insert_returning, params).one()
            return created, updated

    def start_run(self, new: NewRun, decide: Decide) -> AdvanceResult | None:
        """A new run and its first pass in one statement, when that pass
        records one step (the usual start): "now" is the database's clock
        as last read here (:class:`DatabaseClock`), so nothing is read first.
        Otherwise (no recent reading, an idempotency key, another decision)
        the run is only created, and the caller takes the pass."""
        now = self._clock.now()
        if now is None or new.idempotency_key is not None:
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
            self.runner.rows(self.statements.run_start, params)
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
            self._passed.put(step.id, Passed(passed, [step], len(text)))
        return AdvanceResult(run=passed, steps=publish, decision=decision)

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

    # --- steps ---------------------------------------------------------------
    def _claim(self, params: dict[str, Any]) -> StepState | None:
        """One statement: the guarded update, the new attempt row, the
        superseded mark of a lapsed attempt's row, and the run as its pass
        will need it (kept for that pass: it skips its read)."""
        passed = self._passed.take(params["p_id"])
        params["p_known"] = -1 if passed is None else passed.run.version
        st = self.statements
        rows = self.runner.rows(
            st.claim_view_durable if self.durable_claims else st.claim_view, params
        )
        if rows:
            return self._keep_claim_view(rows, passed)
        with self._one() as conn:
            self._refuse_other_task(conn, params)
        return None

    def _keep_claim_view(self, rows: Sequence[Any], passed: Passed | None) -> StepState:
        """The claimed step; the run as the PostgreSQL claim read it is kept
        for that attempt's pass."""
        head = rows[0]
        self._clock.saw(int(head.db_now))
        m = head._mapping
        claimed = SimpleNamespace(**{name: m["c_" + name] for name in STEP_COLUMNS})
        step = step_from(claimed)
        run = None
        input_size = len(m["r_input"] or "")
        if passed is not None and head.r_version == passed.run.version:
            # The claim read no steps and no input: no pass has landed since ours.
            run, input_size = passed.run, passed.input_size
            steps = [step if s.id == step.id else s for s in passed.steps]
        elif len(rows) > CLAIM_VIEW_STEPS or step.seq >= CLAIM_VIEW_STEPS:
            return step  # a big run: the claim read at most its first steps
        else:
            steps = [step if r.id == step.id else step_from(r) for r in rows if r.id is not None]
        remember(
            self._claim_views,
            (step.id, step.attempt),
            ClaimView(
                run or run_from(head, "r_"),
                steps,
                int(head.db_now),
                bool(head.has_signals),
                time.monotonic(),
                int(step.lease_expires_at or 0),
                input_size,
            ),
        )
        return step

    def _fenced_write(
        self, conn: sa.Connection, kind: str, params: dict[str, Any], on_pass_clock: bool = False
    ) -> bool:
        st = self.statements
        ctes = st.fenced_cte_at if on_pass_clock else st.fenced_cte
        return int(conn.execute(ctes[kind], params).scalar_one()) == 1

    def _renew(self, conn: sa.Connection, params: dict[str, Any]) -> bool:
        return int(conn.execute(self.statements.renew_counted_cte, params).scalar_one()) == 1

    def _fenced_outcome(self, kind: str, params: dict[str, Any]) -> bool:
        with self._one() as conn:  # one statement: autocommit
            return self._fenced_write(conn, kind, params)

    # --- the orchestration pass ---------------------------------------------
    def _pass(self, run_id: str, outcome: StepOutcome | None, decide: Decide) -> AdvanceResult:
        """A pass with an outcome first tries the optimistic path; every other
        pass, and any the optimistic path hands back, is the locked pass."""
        done = first = None
        if outcome is not None:
            done = self._advance_optimistic(run_id, outcome, decide)
        elif self._created_here(run_id):
            first = FirstPass(decide)
            done = self._advance_optimistic(run_id, outcome, first.decide)
        if done is not None:
            return done  # a run it ended was announced by its statement
        done = self._advance(run_id, outcome, decide, first)
        if done.decision is not None and done.run.status.terminal:
            self._notify_settled(done.run)
        return done

    # --- waiting for a run to settle (PostgreSQL LISTEN/NOTIFY) ---------------
    def _notify_settled(self, run: RunState) -> None:
        """Tell waiting ``RunHandle.wait`` calls, once per run, after commit."""
        output = json.dumps(run.output, separators=(",", ":"))
        error = None if run.error is None else json.dumps(run.error, separators=(",", ":"))
        notice = settle_notice(run.id, run.status.value, output, error)
        params = {"channel": SETTLED_CHANNEL, "notice": notice}
        # On failure: waiters re-check the run's status at least every second.
        with suppress(sa.exc.DBAPIError):
            self.runner.rows(self.statements.notify_settled, params)

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[SettleWatch | None]:
        """On PostgreSQL, ``wait(timeout)`` returning when a pass settles
        ``run_id`` (registered before the caller reads its status); else None."""
        if self._settle is None:
            self._settle = SettleListener(self._engine)
        with self._settle.watch(run_id) as wait:
            yield wait

    def _advance_optimistic(
        self, run_id: str, outcome: StepOutcome | None, decide: Decide
    ) -> AdvanceResult | None:
        """The hot path: one unlocked read, then the whole pass as one
        version-checked statement (:meth:`PostgresStatements.pass_write`),
        both in autocommit: two round trips and one commit.

        None, with nothing written, when the locked pass must do it instead:
        the version moved (another pass or a signal came first), the run has
        ended, or the decision is not a plain sequential step (fan-out, child
        runs, resolutions...). The locked pass then reads and decides afresh,
        so ``decide`` must be pure (the replay is).
        """
        st = self.statements
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
                rows = conn.execute(st.pass_view, {"p_id": run_id}).all()
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
        new_run = run_after_pass(run, decision, loads(encoded.output), loads(encoded.error), now)
        if ends:
            assert decision.run_status is not None
            params.update(
                p_run_status=decision.run_status.value,
                p_output=encoded.output,
                p_run_error=encoded.error,
                p_notice=settle_notice(
                    run.id, decision.run_status.value, encoded.output, encoded.error
                ),
            )
        publish: list[StepState] = []
        eager = None
        for enc in encoded.steps:
            step = step_created(run, enc, now)
            claim = eager_claim_of(decision.eager, enc.new)
            if claim is not None:
                step = eager = step_created_claimed(step, claim, now)
                attempt = attempt_params(step, AttemptStatus.RUNNING, EAGER, now)
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
            self._keep_eager_view(new_run, [*steps, eager], eager, now, has_signals, input_size)
        elif len(publish) == 1 and len(encoded.steps) == 1:
            self._passed.put(publish[0].id, Passed(new_run, [*steps, publish[0]], input_size))
        return AdvanceResult(run=new_run, steps=publish, decision=decision, eager=eager)

    def _keep_eager_view(
        self,
        run: RunState,
        steps: list[StepState],
        eager: StepState,
        now: int,
        has_signals: bool,
        input_size: int,
    ) -> None:
        """The run as this pass left it, for the pass of the step it claimed."""
        view = ClaimView(
            run,
            steps,
            now,
            has_signals,
            time.monotonic(),
            int(eager.lease_expires_at or 0),
            input_size,
        )
        remember(self._claim_views, (eager.id, eager.attempt), view)

    def _pass_write(
        self, shape: tuple[str | None, bool, bool, bool], params: dict[str, Any]
    ) -> Any:
        """The optimistic pass's one statement: (pinned, fenced)."""
        [row] = self.runner.rows(self.statements.pass_write(*shape), params)
        return row.pinned, row.fenced
