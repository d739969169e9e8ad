"""pikku-celery: durable, crash-proof, multi-step workflows for Celery.

Celery tasks become the steps of a workflow written as plain Python; every
step's outcome lives in your SQL database, fenced by its attempt number.
"""

from .celery import Pikku, QueueLease
from .engine import Context, RunHandle, StepHandle, StepHistory, SweepReport, Workflow
from .engine.transactional import step_connection, transactional
from .errors import (
    CorruptValueError,
    IdempotencyKeyReusedError,
    InvalidIdError,
    InvalidRunIdError,
    LeaseLostError,
    LeaseTakenError,
    PayloadError,
    PikkuError,
    RunNotFoundError,
    RunSettledError,
    SchemaMissingError,
    SignalTimeoutError,
    StepFailedError,
    StoreUnavailableError,
    UnknownTaskError,
    UnknownWorkflowError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
    WorkflowStepFunctionMismatchError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
    WorkflowTimeoutError,
)
from .store.model import RunStatus, StepStatus

__version__ = "0.1.0"

__all__ = [
    "Context",
    "CorruptValueError",
    "IdempotencyKeyReusedError",
    "InvalidIdError",
    "InvalidRunIdError",
    "LeaseLostError",
    "LeaseTakenError",
    "PayloadError",
    "Pikku",
    "PikkuError",
    "QueueLease",
    "RunHandle",
    "RunNotFoundError",
    "RunSettledError",
    "RunStatus",
    "SchemaMissingError",
    "SignalTimeoutError",
    "StepFailedError",
    "StepHandle",
    "StepHistory",
    "StepStatus",
    "StoreUnavailableError",
    "SweepReport",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "Workflow",
    "WorkflowCancelledError",
    "WorkflowFailedError",
    "WorkflowLimitError",
    "WorkflowNondeterminismError",
    "WorkflowStepFunctionMismatchError",
    "WorkflowStepLeaseExpiredError",
    "WorkflowStepSupersededError",
    "WorkflowTimeoutError",
    "__version__",
    "step_connection",
    "transactional",
]
