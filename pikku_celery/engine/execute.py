"""Executing one step attempt: claim, run the body under a lease, advance."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import (
    PayloadError,
    PikkuError,
    StepTimeLimitExceeded,
    WorkflowStepFunctionMismatchError,
    WorkflowStepSupersededError,
    WorkflowStepTimeoutError,
)
from ..model.plan import Landed, PassView
from ..model.values import (
    BROKER,
    EAGER,
    JSON,
    AdvanceResult,
    Delivery,
    StepOutcome,
    StepState,
    StepStatus,
)
from ..payload import dumps
from ..retry import RetryPolicy
from ..store.rules import lease_lapsed
from .eager import EagerOffer, eager_offer
from .interrupt import WATCHER, TimeLimits, brings_limits
from .observe import Carrier
from .orchestrate import advance
from .outage import ride_out
from .replay import error_info
from .transactional import is_transactional, run_with_connection

if TYPE_CHECKING:
    from .core import WorkflowEngine

log = logging.getLogger(__name__)

SHORT_LEASE_MS = 2000

StepBody = Callable[[StepState], JSON]


class RetryStep(Exception):
    """Raised from a step body to ask for another attempt (Celery's ``self.retry``)."""

    def __init__(self, countdown: float | None = None, exc: BaseException | None = None) -> None:
        super().__init__(str(exc) if exc else "retry requested")
        self.countdown = countdown
        self.exc = exc


class FinalStepError(Exception):
    """Raised from a step body to fail the attempt for good, attempts left or
    not: a canvas node's task that did not ask Celery to retry it."""

    def __init__(self, exc: BaseException, details: dict[str, Any] | None = None) -> None:
        super().__init__(str(exc))
        self.exc = exc
        self.details = details or {}
        """Recorded beside the error's type, message and traceback (JSON)."""


def retry_delay(step: StepState) -> float:
    """The wait before the next attempt: ``retry_delay * backoff ** (attempt - 1)``."""
    return float(step.retry_delay * step.backoff ** max(0, step.attempt - 1))


def execute_step(
    engine: WorkflowEngine,
    run_id: str,
    step_id: str,
    task_name: str,
    body: StepBody,
    queue: str | None = None,
    trace: Carrier | None = None,
    delivery: Delivery | None = None,
) -> StepOutcome | None:
    """Run one attempt of a step if this message wins the claim, then the
    run's next steps that its passes wrote claimed by this worker (eager
    steps), within the message's budget.

    Returns the outcome written for the message's own step, or None when the
    message had nothing to do (someone else owns the step, it is settled, or
    it was superseded). ``trace`` is the trace context the message carried,
    for the observers; ``delivery`` names the message and node on every
    attempt it runs.
    """
    carried = Delivery(
        None if delivery is None else delivery.task_id,
        (delivery.node if delivery is not None else None) or engine.worker_id,
    )
    lease_ms = engine.dispatcher.lease_ms(queue)
    if lease_ms < SHORT_LEASE_MS:
        engine.warn_short_lease(queue, lease_ms)
    claimed_ns = time.time_ns()
    known = engine.known_runs.for_claim(step_id, run_id)  # what the last pass left
    try:
        # A claim that cannot reach the store waits here, its message unacked:
        # the step starts the moment the store is back.
        claimed = ride_out(
            engine,
            lambda: engine.store.claim(
                step_id,
                task_name,
                engine.worker_id,
                lease_ms,
                run_id=run_id,
                bound_ms=engine.lease_bound_ms(),
                delivery=carried,
                known=known,
            ),
            f"claiming step {step_id} of run {run_id}",
        )
    except WorkflowStepFunctionMismatchError as exc:
        log.error("refused a step message: %s", exc)
        return None
    if claimed is None:
        _unclaimed(engine, run_id, step_id)
        return None
    engine.known_runs.saw_clock(claimed.step.updated_at)  # the claim's time, on the store's
    budget = engine.eager_budget(lease_ms)
    step: StepState | None = claimed.step
    view = claimed.view  # the run as the claim saw it: handed to the attempt's pass
    first: StepOutcome | None = None
    dispatch = BROKER
    while step is not None:
        offer = eager_offer(engine, budget, body, carried)
        outcome, done = _attempt(
            engine, run_id, step, body, lease_ms, offer, (dispatch, claimed_ns, trace), view
        )
        if first is None:
            first = outcome
        if done is None or done.eager is None or offer is None or offer.body is None:
            break
        assert budget is not None
        budget.take()
        step, body, dispatch = done.eager, offer.body, EAGER
        view = done.handed if isinstance(done, Landed) else None
        lease_ms, claimed_ns = engine.dispatcher.lease_ms(step.queue), time.time_ns()
    return first


def _attempt(
    engine: WorkflowEngine,
    run_id: str,
    step: StepState,
    body: StepBody,
    lease_ms: int,
    offer: EagerOffer | None,
    seen: tuple[str, int, Carrier | None],
    view: PassView | None = None,
) -> tuple[StepOutcome | None, AdvanceResult | None]:
    """One claimed attempt: its body under a renewed lease, then the pass
    that records its outcome (and may claim the next step for this worker).
    ``seen`` is what the observers are told of it: its dispatch, when it was
    claimed (``time.time_ns()``) and the trace context its message carried;
    ``view`` the run as its claim saw it, for its pass."""
    holding = engine.keeper.hold(step.id, step.attempt, lease_ms, step.claim_id, run_id=step.run_id)
    began = time.monotonic()
    limits = time_limits(step, body)
    if limits is not None and limits.hard is not None:
        holding.renew_until = began + limits.hard
    dispatch, claimed_ns, trace = seen
    with engine.observers.attempt(step, dispatch, claimed_ns, trace) as watch:
        try:
            try:
                outcome, committed = _run_limited(engine, step, body, limits)
            except WorkflowStepSupersededError as exc:
                log.warning(
                    "refused a superseded transactional step; its writes rolled back: %s", exc
                )
                engine.observers.write_refused(exc.step_id, exc.attempt, exc.claim_lost)
                watch.refused()
                return None, None
            ran = time.monotonic() - began
            # The lease is still renewed while the outcome is written, so a store
            # that is briefly away (a restart) does not cost the attempt.
            # A committed transactional step is already recorded: the pass only
            # advances, and there is no lease left to keep (a renewal now would
            # be refused and reported as a lease lost to another attempt).
            if committed:
                engine.keeper.drop(holding)
            # The claim's view holds the step unsettled: only a pass that
            # records the outcome itself starts from it.
            if committed:
                done = _advance_retrying(engine, run_id, None, offer)
            else:
                done = _advance_retrying(engine, run_id, outcome, offer, view)
        finally:
            if not holding.dropped:
                engine.keeper.drop(holding)
        if done is None:
            watch.refused()
            if dispatch == BROKER:
                _resend_if_claim_lost(engine, step)
            return None, None
        watch.recorded(outcome)
    engine.observers.step_attempted(step, outcome, ran)
    return outcome, done


def _advance_retrying(
    engine: WorkflowEngine,
    run_id: str,
    outcome: StepOutcome | None,
    offer: EagerOffer | None = None,
    view: PassView | None = None,
) -> AdvanceResult | None:
    """Write the outcome, waiting out a store outage of up to ``outcome_retry``
    seconds: the work is done, and losing its outcome would spend an attempt.
    ``view`` (the claim's) serves the first try only: a retry reads."""
    policy = RetryPolicy(within=engine.outcome_retry, first_pause=0.1, max_pause=2.0)
    handed = [view]

    def once() -> AdvanceResult | None:
        known, handed[0] = handed[0], None
        return advance(engine, run_id, outcome, reason="step", offer=offer, known=known)

    return policy.call(
        once,
        engine.is_transient,
        lambda exc: log.warning(
            "store unavailable while recording step outcome; retrying: %s", exc
        ),
    )


def _resend_if_claim_lost(engine: WorkflowEngine, step: StepState) -> None:
    """The outcome was refused and the step is back where it stood before this
    claim: a database crash lost the claim's asynchronous commit. Its message
    was this one, about to be acked, so the step is sent again now rather
    than when the sweep finds it (after ``message_grace``)."""
    try:
        now = engine.store.get_step(step.id, run_id=step.run_id)
    except Exception as exc:
        if engine.is_transient(exc):
            return  # the sweep sends it once the store is back
        raise
    if now is not None and now.status == StepStatus.SCHEDULED and now.attempt < step.attempt:
        log.warning(
            "step %s of run %s: its claim was lost (a database crash); sending it again",
            step.name,
            step.run_id,
        )
        engine.dispatcher.send_step(now)


def time_limits(step: StepState, body: StepBody) -> TimeLimits | None:
    """The limits of this attempt: ``ctx.step(timeout=)`` and those its body
    brings (a Celery task's own ``time_limit``/``soft_time_limit``)."""
    own = None if step.timeout_ms is None else TimeLimits(hard=step.timeout_ms / 1000)
    brought = body.time_limits(step) if brings_limits(body) else None
    if own is None:
        return brought
    return own.tighter(brought)


def _run_limited(
    engine: WorkflowEngine, step: StepState, body: StepBody, limits: TimeLimits | None
) -> tuple[StepOutcome, bool]:
    """The body (in the step's transaction if it asks for one) under its
    limits: past the hard one, the attempt fails, counting against its retries."""

    done: list[tuple[StepOutcome, bool]] = []

    def run() -> tuple[StepOutcome, bool]:
        if _wants_transaction(body, step):
            done.append(_run_in_transaction(engine, step, body))
        else:
            done.append((_run_body(engine, step, body), False))
        return done[-1]

    if limits is None:
        return run()
    try:
        return WATCHER.run(limits, run)
    except StepTimeLimitExceeded:
        if done and done[-1][1]:
            return done[-1]  # committed just before the limit: the store has its outcome
        limit = f" of {limits.hard:g} s" if limits.hard is not None else ""
        err = WorkflowStepTimeoutError(
            f"step {step.name!r} attempt {step.attempt} ran past its time limit{limit} "
            "and was stopped"
        )
        return _run_failed(step, err), False


def _wants_transaction(body: StepBody, step: StepState) -> bool:
    check = getattr(body, "transactional", None)
    return bool(check(step)) if callable(check) else False


def _run_in_transaction(
    engine: WorkflowEngine, step: StepState, body: StepBody
) -> tuple[StepOutcome, bool]:
    """Run the body and its fenced success write in one store transaction.

    Returns the outcome and whether it is already committed. A body that
    raises rolls its writes back and is recorded as a failure as usual. A
    transaction the store lost (a connection cut, a restart) left nothing
    behind: it is taken again, body and all, for up to ``outcome_retry``
    seconds, as an outcome write would be (the lease is renewed meanwhile).
    """
    store = engine.capabilities.transactional
    if store is None:
        err = PikkuError(
            f"step {step.name!r} is transactional, which needs a SQL store "
            "(its writes share the store's transaction)"
        )
        return _outcome(step, ok=False, error=error_info(err)), False
    policy = RetryPolicy(within=engine.outcome_retry, first_pause=0.1, max_pause=2.0)
    try:
        result = policy.call(
            lambda: store.complete_in_transaction(
                step.id,
                step.attempt,
                lambda conn: run_with_connection(conn, lambda: body(step)),
                step.claim_id,
                run_id=step.run_id,
            ),
            engine.is_transient,
            lambda exc: log.warning(
                "store unavailable while running transactional step %s:%s:%d; taking it again: %s",
                step.run_id,
                step.name,
                step.attempt,
                exc,
            ),
        )
    except WorkflowStepSupersededError:
        raise
    except Exception as exc:
        return _run_failed(step, exc), False
    return _outcome(step, ok=True, result=result), True


def _run_body(engine: WorkflowEngine, step: StepState, body: StepBody) -> StepOutcome:
    try:
        result = body(step)
        check_result(engine, step, result)
    except Exception as exc:
        return _run_failed(step, exc)
    return _outcome(step, ok=True, result=result)


def check_result(engine: WorkflowEngine, step: StepState, result: Any) -> None:
    """Refuse, at the step, a result the store could not take: not JSON, nested
    too deep, or larger than the engine's or the database's limit (which would
    otherwise fail the outcome's write, over and over, as if the store were down)."""
    limit, setting = engine.result_limit()
    dumps(result, f"step {step.name!r}", "result", limit, engine.limits.max_payload_depth, setting)


def _outcome(step: StepState, **fields: Any) -> StepOutcome:
    """The outcome of this claim of ``step``: fenced on its attempt and claim id."""
    return StepOutcome(step.id, step.attempt, claim_id=step.claim_id, **fields)


def _run_failed(step: StepState, exc: Exception) -> StepOutcome:
    """The outcome of a body that raised: another attempt while any are left."""
    if isinstance(exc, PayloadError):  # a result that cannot be stored: not retried
        return _outcome(step, ok=False, error=error_info(exc))
    if isinstance(exc, FinalStepError):
        return _outcome(step, ok=False, error={**error_info(exc.exc), **exc.details})
    if isinstance(exc, RetryStep):
        wait = exc.countdown if exc.countdown is not None else retry_delay(step)
        cause = exc.exc or exc
        return _outcome(step, ok=False, error=error_info(cause), retry_delay=wait)
    more = step.attempt < step.max_attempts
    return _outcome(
        step, ok=False, error=error_info(exc), retry_delay=retry_delay(step) if more else None
    )


def _unclaimed(engine: WorkflowEngine, run_id: str, step_id: str) -> None:
    """A message that lost the claim: refuse a stale or forged one, expire a
    step whose worker is gone for good. A message that came early for a retry
    is dropped: the retry's own message (or the sweep, once due) sends it."""
    store = engine.store
    step = store.get_step(step_id, run_id=run_id)
    if step is None:
        # an unknown step, or one of another run (a stale or forged message)
        log.warning("step message for step %s, not one of run %s: dropped", step_id, run_id)
        return
    now, bound_ms = store.now_ms(), engine.lease_bound_ms()
    if (
        step.status == StepStatus.RUNNING
        and step.attempt >= step.max_attempts
        and lease_lapsed(step.lease_expires_at, now, bound_ms)
        and store.expire_step(step.id, bound_ms, run_id=step.run_id)
    ):
        engine.dispatcher.wake_run(step.run_id, reason="lease-expired")


class call_with:
    """A step body that calls ``fn(*args, **kwargs)`` of the step."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, step: StepState) -> JSON:
        return self.fn(*step.args, **step.kwargs)

    def transactional(self, step: StepState) -> bool:
        """Whether the step's function is marked ``@transactional``."""
        return is_transactional(self.fn)
