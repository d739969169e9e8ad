"""The workflow store: runs, steps and attempts, with fenced outcomes."""

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes
from ..model.cursor import COUNT_CAP, RunCursor
from ..model.values import (
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    AuditAction,
    AuditEntry,
    Decision,
    Delivery,
    ErrorInfo,
    NewRun,
    NewStep,
    Operator,
    RunState,
    RunStatus,
    RunView,
    StepKind,
    StepOutcome,
    StepResolution,
    StepState,
    StepStatus,
    step_id_for,
)
from ..ports.store import Decide, WorkflowStore
from .memory import InMemoryWorkflowStore

if TYPE_CHECKING:
    from .sql import SQLWorkflowStore
    from .sql_for import store_for

_LAZY = {"SQLWorkflowStore": ".sql", "store_for": ".sql_for"}

__all__ = [
    "COUNT_CAP",
    "JSON",
    "AdvanceResult",
    "AttemptState",
    "AttemptStatus",
    "AuditAction",
    "AuditEntry",
    "Decide",
    "Decision",
    "Delivery",
    "ErrorInfo",
    "InMemoryWorkflowStore",
    "NewRun",
    "NewStep",
    "Operator",
    "RunCursor",
    "RunState",
    "RunStatus",
    "RunView",
    "SQLWorkflowStore",
    "StepKind",
    "StepOutcome",
    "StepResolution",
    "StepState",
    "StepStatus",
    "WorkflowStore",
    "step_id_for",
    "store_for",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
