"""The workflow store: runs, steps and attempts, with fenced outcomes."""

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes
from .base import Decide, WorkflowStore
from .memory import InMemoryWorkflowStore
from .model import (
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

if TYPE_CHECKING:
    from .sql import SQLWorkflowStore

_LAZY = {"SQLWorkflowStore": ".sql"}

__all__ = [
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
]

__getattr__ = lazy_attributes(__name__, _LAZY)
