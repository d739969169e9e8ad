"""pikku-celery: durable, crash-proof, multi-step workflows for Celery.

Celery tasks become the steps of a workflow written as plain Python; every
step's outcome lives in your SQL database, fenced by its attempt number.
"""

import importlib
from typing import TYPE_CHECKING, Any

from .engine import Context, RunHandle, StepHandle, StepHistory, SweepReport, Workflow
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

if TYPE_CHECKING:
    from .celery import Pikku, QueueLease
    from .engine.transactional import step_connection, transactional

_LAZY = {
    "Pikku": ".celery",
    "QueueLease": ".celery",
    "step_connection": ".engine.transactional",
    "transactional": ".engine.transactional",
}

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


def __getattr__(name: str) -> Any:
    """The Celery integration and the transactional step, on first use (PEP 562):
    importing the package loads neither Celery nor SQLAlchemy."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
