"""The workflow engine: replay, orchestration, step execution and the sweep."""

from .context import Context, StepHandle
from .core import WorkflowEngine
from .dispatcher import Dispatcher
from .execute import RetryStep, call_with
from .handle import RunHandle, StepHistory
from .observe import AttemptWatch, EngineObserver, RunStart, run_trace
from .run_ids import parse_run_id
from .sweep import SweepReport
from .workflow import Workflow, WorkflowRegistry

__all__ = [
    "AttemptWatch",
    "Context",
    "Dispatcher",
    "EngineObserver",
    "RetryStep",
    "RunHandle",
    "RunStart",
    "StepHandle",
    "StepHistory",
    "SweepReport",
    "Workflow",
    "WorkflowEngine",
    "WorkflowRegistry",
    "call_with",
    "parse_run_id",
    "run_trace",
]
