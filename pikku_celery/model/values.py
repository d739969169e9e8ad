"""What the store keeps: runs, steps and attempts, as plain frozen values.

Every time is epoch milliseconds on the store's clock (the database's), so
deadlines are compared on one clock whatever the workers' clocks say.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

JSON = Any
"""A value that survives ``json.dumps``/``json.loads`` unchanged."""

ErrorInfo = dict[str, Any]
"""``{"type": ..., "message": ..., "traceback": ...}`` of a failure."""


class RunStatus(StrEnum):
    """Where a run is: running (or suspended) until completed, failed or cancelled.

    ``queued`` is a run waiting for a slot of its workflow's concurrency key:
    nothing of it runs until a slot frees and it becomes ``running``."""

    RUNNING = "running"
    SUSPENDED = "suspended"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    QUEUED = "queued"

    @property
    def terminal(self) -> bool:
        """Settled for good: completed, failed or cancelled."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class StepStatus(StrEnum):
    """A step's lifecycle: pending, scheduled (message sent), running, then an outcome."""

    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class StepKind(StrEnum):
    """What a step is: a task for a worker, or something a pass resolves itself."""

    TASK = "task"  # a Celery task run by a worker under a lease
    SLEEP = "sleep"  # a durable timer, resolved by an orchestration pass
    CHILD = "child"  # parked (NULL lease) until its child run ends
    SIGNAL = "signal"  # waits for send_signal or its timeout
    VALUE = "value"  # a recorded value such as ctx.now()


class AttemptStatus(StrEnum):
    """How one attempt of a step ended (or that it is still running)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUPERSEDED = "superseded"  # its lease lapsed and a newer attempt took over
    LEASE_EXPIRED = "lease_expired"  # its lease lapsed with no attempts left
    CANCELLED = "cancelled"  # its run was cancelled while it ran


STEP_NAMESPACE = uuid.UUID("5d1f6f0e-7a53-4c55-9a4e-3b8c1f2d9e10")


def step_id_for(run_id: str, step_name: str) -> str:
    """The stable id of a step, which doubles as its idempotency key."""
    return uuid5_str(run_id, step_name)


def uuid5_str(namespace: str, name: str) -> str:
    """``str(uuid.uuid5(uuid.UUID(namespace), name))``, made without the two
    ``UUID`` objects: step ids are made on every replayed step."""
    try:
        ns = bytes.fromhex(namespace.replace("-", "")) if len(namespace) == 36 else b""
    except ValueError:
        ns = b""
    if len(ns) != 16:
        ns = uuid.UUID(namespace).bytes  # other spellings ({...}, urn:uuid:...) or an error
    digest = bytearray(hashlib.sha1(ns + name.encode(), usedforsecurity=False).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def ms_to_datetime(ms: int | None) -> datetime | None:
    """Epoch milliseconds (the store's clock) as an aware UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


@dataclass(frozen=True)
class RunState:
    """A run as stored: status, input, output or error, and the sweep's bookkeeping."""

    id: str
    workflow: str
    status: RunStatus
    input: JSON
    output: JSON = None
    error: ErrorInfo | None = None
    idempotency_key: str | None = None
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    cancel_requested: bool = False
    version: int = 0
    wake_at: int | None = None  # earliest timer/retry/timeout the run waits for
    next_sweep_at: int | None = None  # the sweep's per-run backoff
    sweep_count: int = 0
    created_at: int = 0
    updated_at: int = 0
    depth: int = 0  # 0 for a run started by start(); a child is its parent's depth + 1
    blocked: str | None = None  # why no pass can run it now (no worker knows its workflow)
    workflow_version: str | None = None  # the version of its workflow it started on
    trace_context: dict[str, str] | None = None  # its trace's W3C carrier (tracing on)
    deadline_at: int | None = None  # it fails with a timeout once this passes (store clock)
    continued_as: str | None = None  # the run ctx.continue_as_new started in its place
    continued_from: str | None = None  # the run that continued as this one


@dataclass(frozen=True)
class StepState:
    """A step as stored; ``attempt`` is its fencing token."""

    id: str
    run_id: str
    name: str
    seq: int
    kind: StepKind
    status: StepStatus
    task_name: str | None = None
    queue: str | None = None
    args: list[JSON] = field(default_factory=list)
    kwargs: dict[str, JSON] = field(default_factory=dict)
    attempt: int = 0  # the fencing token: 0 until the first claim
    max_attempts: int = 1
    retry_delay: float = 0.0
    backoff: float = 1.0
    lease_expires_at: int | None = None  # NULL: no worker expected (never lapses)
    wake_at: int | None = None  # timer due / retry not before / signal timeout
    child_run_id: str | None = None
    result: JSON = None
    error: ErrorInfo | None = None
    worker: str | None = None
    scheduled_at: int | None = None  # when its last message was sent
    route: dict[str, JSON] | None = None  # ctx.step's routing options (exchange, routing_key...)
    claim_id: str | None = None  # the current claim's random id (fences outcomes, renewals)
    created_at: int = 0
    updated_at: int = 0
    timeout_ms: int | None = None  # how long one attempt's body may run (ctx.step(timeout=))

    @property
    def settled(self) -> bool:
        """Succeeded, or failed for good.

        A failed step with a ``wake_at`` is waiting for its next attempt; one
        without is final.
        """
        return self.status == StepStatus.SUCCEEDED or (
            self.status == StepStatus.FAILED and self.wake_at is None
        )


BROKER = "broker"
"""An attempt's dispatch: its worker took it from a broker message."""
EAGER = "eager"
"""An attempt's dispatch: the worker that finished the step before it ran it at once."""


@dataclass(frozen=True)
class Delivery:
    """How an attempt reached its worker, in Celery's words, so a person can
    find its log lines: the id of the message that carried it (an eager
    attempt's carrier) and the worker's node name (``celery@host``; the
    process's ``host:pid`` where no Celery worker runs it)."""

    task_id: str | None = None
    node: str | None = None


@dataclass(frozen=True)
class AttemptState:
    """One attempt of a step: who ran it, when, and how it ended."""

    step_id: str
    attempt: int
    status: AttemptStatus
    worker: str | None = None
    result: JSON = None
    error: ErrorInfo | None = None
    started_at: int = 0
    finished_at: int | None = None
    claim_id: str | None = None  # the claim that made this attempt
    dispatch: str | None = None  # how it reached its worker: "broker" or "eager"
    renewals: int = 0  # how often its worker renewed its lease
    renewed_at: int | None = None  # when it last did
    task_id: str | None = None  # the Celery message that carried it (eager: its carrier)
    node: str | None = None  # Celery's node name of its worker (no worker: host:pid)


class AuditAction(StrEnum):
    """What an operator did to a run."""

    CANCEL = "cancel"
    RETRY = "retry"
    SIGNAL = "signal"


@dataclass(frozen=True)
class Operator:
    """Who asks for an action and from where: the web hook's user (or
    ``"api"``) and the client's address, or the command line's OS user and
    host."""

    actor: str
    origin: str | None = None


@dataclass(frozen=True)
class AuditEntry:
    """One operator action on a run, kept for good: a retry keeps the error
    it cleared in ``details["previous_error"]``."""

    id: int
    run_id: str
    action: AuditAction
    actor: str
    origin: str | None
    details: dict[str, JSON]
    at: int  # on the store's clock


@dataclass(frozen=True)
class NewRun:
    """A run to create; the id is made here so a caller can know it in advance."""

    workflow: str
    input: JSON
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    idempotency_key: str | None = None
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    depth: int = 0
    workflow_version: str | None = None  # the version of the workflow it starts on
    trace_context: dict[str, str] | None = None  # the W3C carrier its spans join
    status: RunStatus = RunStatus.RUNNING  # queued: it waits for a concurrency slot
    timeout_ms: int | None = None  # its deadline: this long after it is created (store clock)
    continued_from: str | None = None  # the run that continued as this one (continue_as_new)


@dataclass(frozen=True)
class NewStep:
    """A step the orchestration pass records for the first time."""

    name: str
    seq: int
    kind: StepKind
    status: StepStatus = StepStatus.SCHEDULED
    task_name: str | None = None
    queue: str | None = None
    args: list[JSON] = field(default_factory=list)
    kwargs: dict[str, JSON] = field(default_factory=dict)
    max_attempts: int = 1
    retry_delay: float = 0.0
    backoff: float = 1.0
    wake_at: int | None = None
    child: NewRun | None = None  # created with the step; the step is parked on it
    result: JSON = None  # for VALUE steps, recorded as succeeded at once
    route: dict[str, JSON] | None = None  # ctx.step's routing options, for every message
    eager: bool = True  # may run eagerly where the step before it ran (ctx.step(eager=False))
    timeout_ms: int | None = None  # how long one attempt's body may run (ctx.step(timeout=))


@dataclass(frozen=True)
class EagerClaim:
    """A new step the pass writes already claimed, for the worker that passes.

    The step is written running as its first attempt (dispatch ``eager``),
    under ``claim_id`` and a lease of ``lease_ms`` on the pass's clock, in
    the same commit as the outcome before it; that worker then runs it at
    once, with no message.
    """

    step_name: str
    worker: str
    lease_ms: int
    claim_id: str
    delivery: Delivery | None = None  # the carrying message's, for the attempt row


@dataclass(frozen=True)
class StepResolution:
    """A non-task step settled by the pass (timer due, signal, timeout)."""

    step_id: str
    ok: bool
    result: JSON = None
    error: ErrorInfo | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What a worker's attempt produced, fenced by ``attempt`` and ``claim_id``.

    ``retry_delay`` (seconds) set on a failure asks for another attempt no
    sooner than that; None fails the step for good.
    """

    step_id: str
    attempt: int
    ok: bool
    result: JSON = None
    error: ErrorInfo | None = None
    retry_delay: float | None = None
    claim_id: str | None = None  # the claim that ran it (None: fenced on the attempt alone)


@dataclass(frozen=True)
class Decision:
    """What one orchestration pass decided (:func:`~.plan.plan_pass` says
    what it writes). Frozen: a change is a new decision (``replace``)."""

    new_steps: list[NewStep] = field(default_factory=list)
    resolutions: list[StepResolution] = field(default_factory=list)
    redispatch: list[str] = field(default_factory=list)  # step ids due for another attempt
    run_status: RunStatus | None = None  # a terminal status ends the run
    output: JSON = None
    error: ErrorInfo | None = None
    wake_at: int | None = None  # when the run must next be looked at
    cancel_children: list[str] = field(default_factory=list)
    eager: EagerClaim | None = None  # one of new_steps, written claimed by the passing worker
    close_open: ErrorInfo | None = None  # the run's open steps end failed with this (a deadline)
    successor: NewRun | None = None  # started as the run ends (ctx.continue_as_new)


@dataclass(frozen=True)
class Settled:
    """How a run ended, as the notice of its settling pass told it."""

    status: RunStatus
    output: JSON = None
    error: ErrorInfo | None = None


@dataclass(frozen=True)
class StepIndex:
    """A view's steps by id and by name, built once per view and carried to
    the next view a pass leaves by copying (at C speed) and updating what
    changed, so a long run's pass does not rebuild it in Python."""

    by_id: dict[str, StepState]
    by_name: dict[str, StepState]

    @classmethod
    def of(cls, steps: list[StepState]) -> StepIndex:
        """The index of ``steps`` built whole (a view's first use)."""
        return cls({s.id: s for s in steps}, {s.name: s for s in steps})

    def updated(self, changed: list[StepState]) -> StepIndex:
        """This index with ``changed`` (new or replaced steps) in it."""
        by_id, by_name = dict(self.by_id), dict(self.by_name)
        for step in changed:
            by_id[step.id] = by_name[step.name] = step
        return StepIndex(by_id, by_name)


@dataclass(frozen=True)
class RunView:
    """The run as one pass sees it, read inside the pass's transaction.

    ``steps`` is in ``seq`` order, ``steps[i].seq == i``. ``reread``: every
    step was just read from the database (an operator may have edited a
    value since this process last saw it), not kept or built by this process.
    """

    run: RunState
    steps: list[StepState]
    signals: dict[str, JSON]
    now: int
    known_index: StepIndex | None = field(default=None, compare=False, repr=False)
    reread: bool = field(default=False, compare=False)

    @property
    def index(self) -> StepIndex:
        """The steps by id and by name (built on first use when not handed)."""
        if self.known_index is None:
            # Frozen, but the index is a cache of ``steps``, not a value of the view.
            object.__setattr__(self, "known_index", StepIndex.of(self.steps))
        assert self.known_index is not None
        return self.known_index

    def with_steps(self, changed: list[StepState], **others: Any) -> RunView:
        """This view with ``changed`` steps in place by ``seq`` (replacing a
        step or appending the next ones), its index carried over; the
        general rebuild when ``changed`` does not fit the order."""
        steps = list(self.steps)
        for step in sorted(changed, key=lambda s: s.seq):
            if step.seq < len(steps) and steps[step.seq].id == step.id:
                steps[step.seq] = step
            elif step.seq == len(steps):
                steps.append(step)
            else:
                merged = _merged(self.steps, changed)
                return replace(self, steps=merged, known_index=None, reread=False, **others)
        index = None if self.known_index is None else self.known_index.updated(changed)
        return replace(self, steps=steps, known_index=index, reread=False, **others)


def _merged(steps: list[StepState], changed: list[StepState]) -> list[StepState]:
    """``steps`` with ``changed`` in (by id), in ``seq`` order."""
    by_id = {s.id: s for s in changed}
    kept = [by_id.pop(s.id, s) for s in steps]
    return sorted([*kept, *by_id.values()], key=lambda s: s.seq)


@dataclass(frozen=True)
class AdvanceResult:
    """What an orchestration pass did: the run after it and the steps to publish."""

    run: RunState  # after the pass
    steps: list[StepState]  # steps inserted or re-dispatched by the pass: publish these
    decision: Decision | None  # None when the run was already settled
    parent_to_wake: str | None = None  # parent run whose child step this pass settled
    children_to_wake: list[str] = field(default_factory=list)
    eager: StepState | None = None  # the step written claimed (Decision.eager), as claimed
