"""The orchestration pass's loop: read, decide, plan, write if the run is unchanged.

The engine owns the pass; the store only reads the run and writes a plan
(:func:`~pikku_celery.model.plan.plan_pass`), pinned to the version it read.
A pass overtaken by another (or by a signal) reads and decides again, here
and nowhere else. What a pass knows of the run before it reads (its claim's
view, a run just created, what the last pass left) is handed to it by the
engine, never kept by the store.
"""

from __future__ import annotations

from ..errors import StoreError
from ..model.plan import (
    Landed,
    Moved,
    PassView,
    PassWrite,
    handing_on,
    kept_view,
    left_by,
    outcome_write,
    plan_pass,
    view_after,
)
from ..model.values import AdvanceResult, NewRun, StepOutcome
from ..payload import dumps
from ..ports.store import Decide, RunStarts, WorkflowStore
from .known_runs import CLOCK_TRUSTED_MS, KnownRuns

PASS_RACES = 50
"""A pass overtaken this often in a row gives up (a wake-up retries it)."""


def take_pass(
    store: WorkflowStore,
    run_id: str,
    outcome: StepOutcome | None,
    decide: Decide,
    known: PassView | None = None,
    runs: KnownRuns | None = None,
) -> AdvanceResult:
    """One pass: ``outcome`` (fenced) and what ``decide`` makes of the run,
    in one write. ``decide`` runs with no transaction open (it is the user's
    body) and again each time the run moved meanwhile, so it must be a pure
    function of the view (the replay is). ``known``: the run as this
    process last saw it (its first read only); ``runs``: the engine's cache,
    told what the landed pass left."""
    optimistic = outcome is not None  # the first read may be unlocked: the write is fenced
    for _ in range(PASS_RACES):
        read = store.read_pass(run_id, known, optimistic)
        known, optimistic = None, False
        view = read.view
        if runs is not None and read.good_until is None:
            runs.saw_clock(view.now)
        if view.run.status.terminal and outcome is None:
            return AdvanceResult(run=view.run, steps=[], decision=None)
        written = None if outcome is None else outcome_write(view, outcome)
        seen = view_after(view, written)
        decision = None if seen.run.status.terminal else decide(seen)
        plan = plan_pass(seen, written, decision)
        done = store.write_pass(read, plan)
        if not isinstance(done, Moved):
            return hand_on(done, read, plan, runs)
    raise StoreError(
        f"workflow run {run_id}: {PASS_RACES} passes in a row were overtaken by others; "
        "the pass is left to the next wake-up"
    )


def hand_on(done: AdvanceResult, read: PassView, plan: PassWrite, runs: KnownRuns | None) -> Landed:
    """The landed pass, with the view its eager step's pass starts from; the
    run as it left it is kept for the claim of the one step it published,
    and as the run's latest view for the claims of steps published before."""
    if plan.eager is not None:
        return handing_on(done, left_by(read, plan))
    if runs is not None and plan.decision is not None:
        left = left_by(read, plan)
        if len(done.steps) == 1:
            runs.put(done.steps[0].id, left)
        runs.keep_latest(left)
    return handing_on(done, None)


def start_pass(
    store: WorkflowStore,
    starts: RunStarts | None,
    new: NewRun,
    decide: Decide,
    runs: KnownRuns | None = None,
) -> AdvanceResult:
    """Create the run ``new`` and take its first pass, in one write where
    the store can. If ``decide`` raises, the run is created first, so that
    its failure can be recorded."""
    now = None if runs is None else runs.clock()
    read = None if starts is None or now is None else starts.start_view(new, now)
    if starts is None or read is None:
        return take_pass(store, new.id, None, decide, created(store, new, runs), runs)
    try:
        plan = plan_pass(read.view, None, decide(read.view))
    except BaseException:
        store.create_run(new)
        raise
    done = starts.write_start(new, read, plan)
    if done is not None:
        return hand_on(done, read, plan, runs)
    return take_pass(store, new.id, None, decide, created(store, new, runs), runs)


def created(store: WorkflowStore, new: NewRun, runs: KnownRuns | None) -> PassView | None:
    """Create the run; as created, it is its first pass's view (None: the
    idempotency key named a run that was there already)."""
    run, made = store.create_run(new)
    if not made:
        return None
    if runs is not None:
        runs.saw_clock(run.updated_at)  # the store's clock at its creation
    size = len(dumps(new.input, f"workflow {new.workflow!r}", "input"))
    good_until = run.updated_at + CLOCK_TRUSTED_MS
    return kept_view(run, [], {}, run.updated_at, size, good_until, "created")
