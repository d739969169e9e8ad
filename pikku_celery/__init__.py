"""pikku-celery: durable, crash-proof, multi-step workflows for Celery.

Celery tasks become the steps of a workflow written as plain Python; every
step's outcome lives in your SQL database, fenced by its attempt number.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .engine import Context, RunHandle, StepHandle, StepHistory, SweepReport, Workflow
from .engine.concurrency import Concurrency
from .errors import (
    CanvasError,
    CorruptValueError,
    EventNotSetError,
    EventTimeoutError,
    IdempotencyKeyReusedError,
    InvalidIdError,
    InvalidRunIdError,
    LeaseLostError,
    LeaseTakenError,
    PayloadError,
    PikkuError,
    PoolerWarning,
    RunNotFoundError,
    RunSettledError,
    SchemaMissingError,
    SignalAlreadySentError,
    SignalTimeoutError,
    StepFailedError,
    StepTimeLimitExceeded,
    StoreUnavailableError,
    UnknownPatchError,
    UnknownTaskError,
    UnknownWorkflowError,
    UnknownWorkflowVersionError,
    WorkflowCancelledError,
    WorkflowDeadlineError,
    WorkflowFailedError,
    WorkflowLimitError,
    WorkflowNondeterminismError,
    WorkflowStepFunctionMismatchError,
    WorkflowStepLeaseExpiredError,
    WorkflowStepSupersededError,
    WorkflowStepTimeoutError,
    WorkflowTimeoutError,
)
from .lazy import lazy_attributes
from .model.values import RunStatus, StepStatus
from .store.events import RunEvent
from .version import __version__

if TYPE_CHECKING:
    from .canvas.handle import CanvasRun
    from .canvas.result import DurableResult
    from .celery import Pikku, QueueLease
    from .engine.transactional import step_connection, transactional

_LAZY = {
    "CanvasRun": ".canvas.handle",
    "DurableResult": ".canvas.result",
    "Pikku": ".celery",
    "QueueLease": ".celery",
    "step_connection": ".engine.transactional",
    "transactional": ".engine.transactional",
}

__all__ = [
    "CanvasError",
    "CanvasRun",
    "Concurrency",
    "Context",
    "CorruptValueError",
    "DurableResult",
    "EventNotSetError",
    "EventTimeoutError",
    "IdempotencyKeyReusedError",
    "InvalidIdError",
    "InvalidRunIdError",
    "LeaseLostError",
    "LeaseTakenError",
    "PayloadError",
    "Pikku",
    "PikkuError",
    "PoolerWarning",
    "QueueLease",
    "RunEvent",
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
    "StepTimeLimitExceeded",
    "StoreUnavailableError",
    "SweepReport",
    "UnknownPatchError",
    "UnknownTaskError",
    "UnknownWorkflowError",
    "UnknownWorkflowVersionError",
    "Workflow",
    "WorkflowCancelledError",
    "WorkflowDeadlineError",
    "WorkflowFailedError",
    "WorkflowLimitError",
    "WorkflowNondeterminismError",
    "WorkflowStepFunctionMismatchError",
    "WorkflowStepLeaseExpiredError",
    "WorkflowStepSupersededError",
    "WorkflowStepTimeoutError",
    "WorkflowTimeoutError",
    "__version__",
    "step_connection",
    "transactional",
]

_lazy = lazy_attributes(__name__, _LAZY)


def __getattr__(name: str) -> Any:
    if name == "Pikku":
        # Durable canvas builds on the Celery integration and registers itself
        # with it when imported: every Pikku made from here has durable().
        importlib.import_module(".canvas.extension", __name__)
    return _lazy(name)
