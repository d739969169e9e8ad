"""Every exception a user of pikku-celery can catch.

All derive from :class:`PikkuError` so one ``except`` can cover the library.
"""

from __future__ import annotations

from typing import Any


class PikkuError(Exception):
    """Base class of every pikku-celery error."""


# --- leases -----------------------------------------------------------------


class LeaseError(PikkuError):
    """Base class of lease errors."""


class LeaseTakenError(LeaseError):
    """The key is held by another holder whose lease is still live."""

    def __init__(self, key: str) -> None:
        super().__init__(f"lease {key!r} is held by another holder")
        self.key = key


class LeaseLostError(LeaseError):
    """The lease lapsed or changed hands while the guarded work ran.

    Whatever the work produced must not be taken as produced under the lease.
    """

    def __init__(self, key: str, detail: str = "") -> None:
        msg = f"lease {key!r} was lost while the work ran"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.key = key


# --- store ------------------------------------------------------------------


class StoreError(PikkuError):
    """Base class of workflow store errors."""


class StoreUnavailableError(StoreError):
    """The workflow database cannot be reached (down, restarting, wrong host or port).

    Public calls (``start``, ``send_signal``, ``cancel``, ``retry``, the
    reads and ``wait`` of a :class:`~pikku_celery.RunHandle`, the page's API)
    wait out an outage first, for their timeout or the engine's
    ``outage_timeout``, and raise this once it lasts longer; never the
    driver's own exception. The web API answers it with 503 and
    ``Retry-After``. See ``docs/outages.md``.
    """


class SchemaMissingError(StoreError):
    """The database lacks pikku's tables or columns; migrations must be run."""


class PayloadError(StoreError, TypeError):
    """A value handed to pikku is not JSON (or too large); nothing was written."""


class CanvasError(PayloadError):
    """A canvas that cannot run durably (an unsupported option, a link cycle, a
    chord with an empty header, ...): refused at ``durable(...)``, nothing stored."""


class DuplicateStepError(StoreError):
    """A run already has a step of that name (step names are unique per run)."""


class IdempotencyKeyReusedError(StoreError):
    """``start`` was given an idempotency key already used for another input.

    ``run_id`` is the run the key belongs to; nothing was written.
    """

    def __init__(self, workflow: str, key: str, run_id: str) -> None:
        super().__init__(
            f"idempotency key {key!r} of workflow {workflow!r} already started run {run_id} "
            "with a different input; use a new key for a new input, or the same input to "
            "get that run back"
        )
        self.workflow = workflow
        self.key = key
        self.run_id = run_id


class RunSettledError(StoreError):
    """The run has ended; it takes no more signals or changes."""


class SignalAlreadySentError(StoreError):
    """The run already has a signal of this name with another payload; the
    first one stands (a resend of the same payload is accepted)."""


class InvalidIdError(PikkuError, ValueError):
    """An id (of a run or a step) that is not a UUID: refused before any lookup."""


class InvalidRunIdError(InvalidIdError):
    """A run id that is not a UUID: refused before any lookup."""


class RunNotFoundError(StoreError, LookupError):
    """No workflow run has the given id."""


class WorkflowStepSupersededError(StoreError):
    """An outcome write came from an attempt (or a claim) that is no longer current.

    Raised by fenced writes; nothing was changed.
    """

    def __init__(self, step_id: str, attempt: int, claim_lost: bool = False) -> None:
        reason = (
            "its claim is no longer the step's: the claim id differs (the database lost "
            "that claim, and the step was claimed again with the same attempt number)"
            if claim_lost
            else "it is no longer the current attempt"
        )
        super().__init__(f"step {step_id} attempt {attempt}: {reason}")
        self.step_id = step_id
        self.attempt = attempt
        self.claim_lost = claim_lost
        """Whether the attempt number matched and the claim id did not."""


class WorkflowStepLeaseExpiredError(StoreError):
    """A step lost its worker on every one of its attempts."""


class WorkflowStepFunctionMismatchError(StoreError):
    """A step message names a different task than the one recorded for the step."""

    def __init__(self, step_id: str, recorded: str | None, received: str) -> None:
        super().__init__(
            f"step {step_id} was recorded for task {recorded!r} but the message names {received!r}"
        )
        self.step_id = step_id
        self.recorded = recorded
        self.received = received


# --- workflows --------------------------------------------------------------


class WorkflowError(PikkuError):
    """Base class of workflow errors."""


class UnknownWorkflowError(WorkflowError, LookupError):
    """No workflow is registered under that name."""


class UnknownWorkflowVersionError(UnknownWorkflowError):
    """A run is pinned to a version of its workflow this worker does not have."""


class UnknownTaskError(WorkflowError, LookupError):
    """A step names a task that is not registered with the workers' app."""


class WorkflowNondeterminismError(WorkflowError):
    """A replay reached steps in a different order than recorded.

    ``index`` is the step's number in the run (from 0, as in ``runs show``),
    ``reached`` the step the body reached there and ``recorded`` the one the
    history holds there (None when the body reused a name), each as
    ``(kind, name)``; all None when unknown."""

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        reached: tuple[str, str] | None = None,
        recorded: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.reached = reached
        self.recorded = recorded


class UnknownPatchError(UnknownWorkflowVersionError, WorkflowNondeterminismError):
    """A run's history holds a ``ctx.patched`` marker where this code reaches
    another step: newer code made the run (a rolling deploy), or the patch
    call was removed while runs still hold it. The run is left, blocked, for
    a worker whose code knows the patch, rather than failed."""


class WorkflowLimitError(WorkflowError):
    """A run went past one of its bounds (steps, children, depth, a pass's budget)."""


class CorruptValueError(StoreError):
    """A stored value cannot be read back (invalid JSON left by an edit); names
    the run, step and column."""


class StepFailedError(WorkflowError):
    """A step failed for good; the body may catch it to compensate."""

    def __init__(
        self,
        step: str,
        error_type: str,
        message: str,
        traceback: str = "",
    ) -> None:
        super().__init__(f"step {step!r} failed: {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.message = message
        self.traceback = traceback


class SignalTimeoutError(WorkflowError):
    """``ctx.wait_for_signal`` reached its timeout before the signal came."""

    def __init__(self, name: str) -> None:
        super().__init__(f"signal {name!r} did not arrive before its timeout")
        self.name = name


class WorkflowFailedError(WorkflowError):
    """The run ended failed; ``error`` holds the recorded error."""

    def __init__(self, run_id: str, error: dict[str, Any] | None) -> None:
        err = error or {}
        super().__init__(
            f"workflow run {run_id} failed: {err.get('type', 'Error')}: {err.get('message', '')}"
        )
        self.run_id = run_id
        self.error = err


class WorkflowCancelledError(WorkflowError):
    """The run was cancelled."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"workflow run {run_id} was cancelled")
        self.run_id = run_id


class WorkflowTimeoutError(WorkflowError, TimeoutError):
    """``RunHandle.wait`` gave up before the run settled."""


class PoolerWarning(UserWarning):
    """pikku's PostgreSQL connections go through a connection pooler (PgBouncer)
    that no ``pooler=`` setting names: set ``Pikku(..., pooler="transaction")``
    behind transaction pooling, ``"session"`` behind session pooling."""


class EventNotSetError(WorkflowError, LookupError):
    """``RunHandle.get_event`` found no value for the key: the run ended without
    setting it (or, as :class:`EventTimeoutError`, it was not set in time)."""

    def __init__(self, run_id: str, key: str, detail: str) -> None:
        super().__init__(f"workflow run {run_id} has no event {key!r}: {detail}")
        self.run_id = run_id
        self.key = key


class EventTimeoutError(EventNotSetError, TimeoutError):
    """``RunHandle.get_event`` waited its ``timeout`` and the key was still unset."""

    """``RunHandle.wait`` gave up before the run settled (its subclass
    :class:`WorkflowDeadlineError`: the run itself passed its deadline)."""


class WorkflowDeadlineError(WorkflowTimeoutError, WorkflowFailedError):
    """The run passed its deadline (``start(timeout=)``, ``@workflow(timeout=)``)
    on the database's clock and failed: its open steps were closed and its
    children asked to stop. Both a timeout and a failure, so either
    ``except`` catches it."""

    def __init__(self, run_id: str, error: dict[str, Any] | None) -> None:
        WorkflowFailedError.__init__(self, run_id, error)


class WorkflowStepTimeoutError(WorkflowError, TimeoutError):
    """A step's attempt ran past its time limit (``ctx.step(timeout=)`` or
    its task's ``time_limit``): recorded as that attempt's error; the step
    retries while it has attempts left."""


class StepTimeLimitExceeded(BaseException):
    """Raised inside a step's body when its hard time limit passes.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that a body's
    ``except Exception`` does not swallow it; it is raised again every
    second until the body ends. The attempt is recorded as failed with
    :class:`WorkflowStepTimeoutError`."""
