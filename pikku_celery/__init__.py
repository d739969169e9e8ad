"""pikku-celery: durable, crash-proof, multi-step workflows for Celery.

Celery tasks become the steps of a workflow written as plain Python; every
step's outcome lives in your SQL database, fenced by its attempt number.
"""

from typing import TYPE_CHECKING

from .engine import Context, RunHandle, StepHandle, StepHistory, SweepReport, Workflow
from .errors import (
    CanvasError,
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
    SignalAlreadySentError,
    SignalTimeoutError,
    StepFailedError,
    StoreUnavailableError,
    UnknownPatchError,
    UnknownTaskError,
    UnknownWorkflowError,
    UnknownWorkflowVersionError,
    WorkflowCancelledError,
    WorkflowFailedError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
    WorkflowStepFunctionMismatchError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
    WorkflowTimeoutError,
)
from .lazy import lazy_attributes
from .store.model import RunStatus, StepStatus

if TYPE_CHECKING:
    from .canvas.handle import CanvasRun
    from .celery import Pikku, QueueLease
    from .engine.transactional import step_connection, transactional

_LAZY = {
    "CanvasRun": ".canvas.handle",
    "Pikku": ".celery",
    "QueueLease": ".celery",
    "step_connection": ".engine.transactional",
    "transactional": ".engine.transactional",
}

__version__ = "0.1.0"

__all__ = [
    "CanvasError",
    "CanvasRun",
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
    "SignalAlreadySentError",
    "SignalTimeoutError",
    "StepFailedError",
    "StepHandle",
    "StepHistory",
    "StepStatus",
    "StoreUnavailableError",
    "SweepReport",
    "UnknownPatchError",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "UnknownWorkflowVersionError",
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

__getattr__ = lazy_attributes(__name__, _LAZY)
