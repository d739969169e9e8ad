"""The workflow store: runs, steps and attempts, with fenced outcomes."""

import importlib
from typing import TYPE_CHECKING, Any

from .base import Decide, WorkflowStore
from .memory import InMemoryWorkflowStore
from .model import (
    JSON,
    AdvanceResult,
    AttemptState,
    AttemptStatus,
    Decision,
    ErrorInfo,
    NewRun,
    NewStep,
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
    "Decide",
    "Decision",
    "ErrorInfo",
    "InMemoryWorkflowStore",
    "NewRun",
    "NewStep",
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


def __getattr__(name: str) -> Any:
    """The SQL store, on first use (PEP 562): importing the package loads no SQLAlchemy."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
