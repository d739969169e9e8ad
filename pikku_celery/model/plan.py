"""What one orchestration pass records, decided once: the plan every store writes.

:func:`plan_pass` is the only place that says what a pass writes: the
outcome's effect, the new step rows (the eager claim and child runs
included), the steps the pass settles, the run's new state, the steps closed
when the run ends, the parent step it settles and what to publish. A store
maps a :class:`PassWrite` to its own writes and decides nothing: the memory
store applies it to its dicts, the SQL stores to statements.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields, replace

from ..payload import dumps, loads
from .changes import (
    child_outcome,
    eager_claim_of,
    fence_holds,
    run_after_pass,
    run_cancelled_error,
    step_after_outcome,
    step_created,
    step_created_claimed,
    step_parked_on_child,
    step_resolved,
    superseded,
)
from .encode import EncodedDecision, EncodedStep, encode_decision
from .values import (
    EAGER,
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    Decision,
    ErrorInfo,
    NewRun,
    NewStep,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepState,
    StepStatus,
)

KEPT_MARGIN_MS = 250
"""A view kept from a claim stands in for a read until this long before
the claim's first lease ends: until then no other attempt can have taken
the step, so the view's fence holds."""


@dataclass(frozen=True)
class PassView:
    """The run as a store read it for a pass, with what its write needs of the read."""

    view: RunView
    input_size: int = 0  # the run's input as stored (its JSON text's length)
    source: str = "read"  # "read": read for any write; "kept": kept by this process
    # (a claim's view) or read unlocked, for the one-write pass only; "created": a
    # run as this process creates it (any write may take its plan)
    good_until: int | None = None  # a kept view: its last moment, on the store's clock
    read_at: float = 0.0  # a kept view: time.monotonic() when ``view.now`` was read

    def kept(self, run_id: str) -> PassView | None:
        """This kept view of ``run_id`` as of now ("now" moved on by this
        process's monotonic clock, anchored on the store's), or None once it
        may be stale: every pass's write is version-checked, so a stale view
        would cost a retry, never a wrong write."""
        if self.good_until is None or self.view.run.id != run_id:
            return None
        now = self.view.now + int((time.monotonic() - self.read_at) * 1000)
        if now >= self.good_until:
            return None
        return replace(self, view=replace(self.view, now=now))


def kept_view(
    run: RunState,
    steps: list[StepState],
    signals: dict[str, JSON],
    now: int,
    input_size: int,
    good_until: int,
    source: str = "kept",
    reread: bool = False,
) -> PassView:
    """A view this process keeps for one next pass (read at ``now``, on
    the store's clock, just now), trusted until ``good_until``."""
    view = RunView(run=run, steps=steps, signals=signals, now=now, reread=reread)
    return PassView(view, input_size, source, good_until, time.monotonic())


def claim_view(
    known: PassView, step: StepState, now: int, signals: dict[str, JSON] | None = None
) -> PassView:
    """The run as ``known`` (the pass that scheduled ``step``) left it, with
    ``step`` as its claim wrote it: that attempt's view, for its pass."""
    lease = int(step.lease_expires_at or 0)
    seen = known.view.signals if signals is None else signals
    view = known.view.with_steps([step], signals=seen, now=now)
    return PassView(view, known.input_size, "kept", lease - KEPT_MARGIN_MS, time.monotonic())


@dataclass(frozen=True)
class Claim:
    """A step claimed for a new attempt, and the run as the claim saw it:
    the engine hands that view to the attempt's pass, which then needs no
    read of its own (None: the pass reads)."""

    step: StepState
    view: PassView | None = None


@dataclass(frozen=True)
class Landed(AdvanceResult):
    """A pass as written, with the view its eager step's pass starts from
    (the engine hands it on, as it hands on the eager step)."""

    handed: PassView | None = None


@dataclass(frozen=True)
class Moved:
    """A pass that wrote nothing: the run's version moved since its view (another
    pass or a signal landed); the engine reads and decides again."""

    run_id: str


@dataclass(frozen=True)
class OutcomeWrite:
    """A worker's outcome, checked against the view's fence and serialised.

    The store writes it fenced again: the view may be older than the row.
    """

    outcome: StepOutcome  # its payloads as they read back once stored
    kind: str  # "complete", "fail" or "fail_retry"
    text: str  # the result's JSON (complete) or the error's (fail)
    step: StepState | None  # the step as the write leaves it (None: not in the view)

    @property
    def delay_ms(self) -> int | None:
        """The wait before the next attempt a failure asks for (None: final)."""
        delay = self.outcome.retry_delay
        return None if delay is None else round(delay * 1000)


@dataclass(frozen=True)
class StepRow:
    """A step the pass inserts, as its row reads back once written."""

    new: NewStep
    step: StepState  # claimed (the eager claim), parked on its child, or settled (a value)
    args: str  # JSON text of each payload
    kwargs: str
    value: str | None
    child: NewRun | None  # the child run created with it
    child_input: str | None
    attempt: AttemptState | None  # its first attempt's row (an eager claim, a child run)

    @property
    def settled_value(self) -> bool:
        """A value step recorded settled (an event, ``ctx.now``, a patch marker)."""
        return self.new.kind == StepKind.VALUE and self.new.status == StepStatus.SUCCEEDED


@dataclass(frozen=True)
class Resolved:
    """A step the pass settles itself: a timer fired, a signal came, a child ended."""

    step: StepState  # as the pass leaves it
    result: str | None  # JSON text
    error: str | None
    attempt: AttemptStatus | None  # a child step's attempt ends so too


@dataclass(frozen=True)
class ParentSettle:
    """The parent's parked step that an ending child run settles, if it still
    waits on this child (the store's write is guarded on that)."""

    run_id: str  # the parent run
    step_id: str
    child_run_id: str
    ok: bool
    result: JSON
    error: ErrorInfo | None

    @property
    def result_text(self) -> str | None:
        """The result as stored."""
        return json.dumps(self.result) if self.ok else None

    @property
    def error_text(self) -> str | None:
        """The error as stored."""
        return None if self.error is None else json.dumps(self.error)


@dataclass(frozen=True)
class PassWrite:
    """Everything one pass writes, in one transaction, only on the run's
    version the view read (another pass or a signal in between: nothing)."""

    view: RunView  # what the pass saw, the outcome applied
    outcome: OutcomeWrite | None
    decision: Decision | None  # None: the run had ended, only the outcome is written
    run: RunState  # the run as the pass leaves it
    inserts: tuple[StepRow, ...] = ()
    resolved: tuple[Resolved, ...] = ()
    redispatch: tuple[StepState, ...] = ()  # due for another attempt: sent again
    cancel_children: tuple[str, ...] = ()  # child runs asked to cancel (if still live)
    close_open: ErrorInfo | None = None  # the run's open steps and attempts end with this
    output: str | None = None  # the run's, as JSON text, when it ends
    error: str | None = None
    parent: ParentSettle | None = None
    publish: tuple[StepState, ...] = ()  # scheduled task steps to send once it lands
    eager: StepState | None = None  # the step written claimed for the passing worker
    successor: NewRun | None = None  # the run started as this one ends (continue_as_new)
    successor_input: str | None = None  # its input, as JSON text

    @property
    def now(self) -> int:
        """The pass's clock: every time it writes."""
        return self.view.now

    @property
    def version(self) -> int:
        """The run's version the write is pinned to."""
        return self.view.run.version

    @property
    def ends(self) -> bool:
        """Whether the pass ends the run."""
        status = None if self.decision is None else self.decision.run_status
        return status is not None and status.terminal

    @property
    def children(self) -> list[str]:
        """The child runs the pass creates."""
        return [row.child.id for row in self.inserts if row.child is not None]

    @property
    def successors(self) -> list[str]:
        """The run the pass starts in this one's place, if any (continue_as_new)."""
        return [] if self.successor is None else [self.successor.id]

    @property
    def view_left(self) -> RunView:
        """The run as the pass leaves it once it lands (its index carried)."""
        changed = [*(r.step for r in self.resolved), *self.redispatch]
        changed += [row.step for row in self.inserts]
        return self.view.with_steps(changed, run=self.run)

    def landed(self, cancelled: list[str], parent_woken: bool) -> AdvanceResult:
        """What the pass did once written: ``cancelled``, the children the
        write asked to cancel (those still live), and whether the parent's
        step was settled."""
        return AdvanceResult(
            run=self.run,
            steps=list(self.publish),
            decision=self.decision,
            parent_to_wake=self.parent.run_id if parent_woken and self.parent else None,
            children_to_wake=[*self.children, *cancelled, *self.successors],
            eager=self.eager,
        )


def left_by(read: PassView, plan: PassWrite) -> PassView:
    """The run as ``plan`` (made on ``read``) left it once landed: what the
    pass of its eager step starts from (trusted while the eager claim's
    first lease is surely live), or the claim of the one step it published."""
    eager = plan.eager
    good_until = None if eager is None else int(eager.lease_expires_at or 0) - KEPT_MARGIN_MS
    return PassView(plan.view_left, read.input_size, "kept", good_until, time.monotonic())


def handing_on(done: AdvanceResult, handed: PassView | None) -> Landed:
    """``done`` with the view its eager step's pass starts from."""
    return Landed(**{f.name: getattr(done, f.name) for f in fields(AdvanceResult)}, handed=handed)


def outcome_write(view: RunView, outcome: StepOutcome) -> OutcomeWrite:
    """Check ``outcome``'s fence on the view and serialise its payload
    (raises :class:`~pikku_celery.errors.WorkflowStepSupersededError`)."""
    step = view.index.by_id.get(outcome.step_id)
    if step is not None and not fence_holds(step, outcome.attempt, outcome.claim_id):
        raise superseded(outcome.step_id, step, outcome.attempt, outcome.claim_id)
    where = f"step {step.name!r}" if step is not None else f"step {outcome.step_id}"
    if outcome.ok:
        text = dumps(outcome.result, where, "result")
        stored = replace(outcome, result=json.loads(text), error=None)
        kind = "complete"
    else:
        text = dumps(outcome.error, where, "error")
        stored = replace(outcome, error=json.loads(text), result=None)
        kind = "fail" if outcome.retry_delay is None else "fail_retry"
    done = None if step is None else step_after_outcome(step, stored, view.now)
    return OutcomeWrite(stored, kind, text, done)


def view_after(view: RunView, written: OutcomeWrite | None) -> RunView:
    """The view the pass decides on: the outcome as it will be written."""
    if written is None or written.step is None:
        return view
    done = written.step
    return view.with_steps([done])


def to_publish(step: StepState) -> bool:
    """A step the pass leaves for a worker to take from a message."""
    return step.kind == StepKind.TASK and step.status == StepStatus.SCHEDULED


def plan_pass(view: RunView, outcome: OutcomeWrite | None, decision: Decision | None) -> PassWrite:
    """What the pass writes: ``decision``, made on ``view`` (the outcome
    applied: :func:`view_after`). Every payload is serialised and every step
    name checked first, so a refused pass writes nothing in any store."""
    run = view.run
    if decision is None:
        return PassWrite(view=view, outcome=outcome, decision=None, run=run)
    index = view.index
    encoded = encode_decision(run, index, decision)
    now = view.now
    by_id = index.by_id
    inserts = tuple(_step_row(run, enc, decision, now) for enc in encoded.steps)
    redispatch = tuple(replace(by_id[sid], scheduled_at=now) for sid in decision.redispatch)
    output, error = loads(encoded.output), loads(encoded.error)
    close = run_cancelled_error() if decision.run_status == RunStatus.CANCELLED else None
    eager = next((r.step for r in inserts if r.attempt and r.attempt.dispatch == EAGER), None)
    new_run = run_after_pass(run, decision, output, error, now)
    successor, successor_input = _successor(run, decision)
    if successor is not None:
        new_run = replace(new_run, continued_as=successor.id)
    return PassWrite(
        view=view,
        outcome=outcome,
        decision=decision,
        run=new_run,
        inserts=inserts,
        resolved=_resolved(encoded, by_id, now),
        redispatch=redispatch,
        cancel_children=tuple(decision.cancel_children),
        close_open=close if close is not None else decision.close_open,
        output=encoded.output,
        error=encoded.error,
        parent=_parent(new_run, decision),
        publish=(*(r.step for r in inserts if to_publish(r.step)), *redispatch),
        eager=eager,
        successor=successor,
        successor_input=successor_input,
    )


def _successor(run: RunState, decision: Decision) -> tuple[NewRun | None, str | None]:
    """The run a completing pass starts in this one's place, its input
    serialised (so a refused input writes nothing), linked back to ``run``."""
    new = decision.successor
    if new is None or decision.run_status != RunStatus.COMPLETED:
        return None, None
    text = dumps(new.input, f"continue_as_new of run {run.id}", "input")
    return replace(new, input=json.loads(text), continued_from=run.id), text


def _step_row(run: RunState, enc: EncodedStep, decision: Decision, now: int) -> StepRow:
    """A new step's row: claimed if the pass's eager claim names it, parked
    on its child run if it starts one."""
    new = enc.new
    step = step_created(run, enc, now)
    claim = eager_claim_of(decision.eager, new)
    if claim is not None:
        step = step_created_claimed(step, claim, now)
        delivery = claim.delivery
        attempt = AttemptState(
            step.id,
            step.attempt,
            AttemptStatus.RUNNING,
            worker=step.worker,
            started_at=now,
            claim_id=step.claim_id,
            dispatch=EAGER,
            task_id=None if delivery is None else delivery.task_id,
            node=None if delivery is None else delivery.node,
        )
        return StepRow(new, step, enc.args, enc.kwargs, enc.value, None, None, attempt)
    if new.child is None or enc.child_input is None:
        return StepRow(new, step, enc.args, enc.kwargs, enc.value, None, None, None)
    child = replace(new.child, parent_run_id=run.id, parent_step_id=enc.id, depth=run.depth + 1)
    step = step_parked_on_child(step, child.id)
    attempt = AttemptState(step.id, 1, AttemptStatus.RUNNING, worker=None, started_at=now)
    return StepRow(new, step, enc.args, enc.kwargs, enc.value, child, enc.child_input, attempt)


def _resolved(
    encoded: EncodedDecision, by_id: dict[str, StepState], now: int
) -> tuple[Resolved, ...]:
    """The steps the pass settles; one settled already is left as it is."""
    out: list[Resolved] = []
    for enc in encoded.resolutions:
        res = enc.resolution
        step = by_id[res.step_id]
        if step.settled:
            continue
        done = step_resolved(step, res.ok, loads(enc.result), loads(enc.error), now)
        ended = AttemptStatus.SUCCEEDED if res.ok else AttemptStatus.FAILED
        attempt = ended if step.kind == StepKind.CHILD else None
        out.append(Resolved(done, enc.result, enc.error, attempt))
    return tuple(out)


def _parent(run: RunState, decision: Decision) -> ParentSettle | None:
    """The parent's step a child run settles as it ends."""
    ends = decision.run_status is not None and decision.run_status.terminal
    if not ends or run.parent_run_id is None or run.parent_step_id is None:
        return None
    ended = replace(decision, output=run.output, error=run.error)
    ok, result, error = child_outcome(run.id, ended)
    return ParentSettle(run.parent_run_id, run.parent_step_id, run.id, ok, result, error)
