"""Workflow definitions and the registry that names them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import UnknownWorkflowError
from ..store.model import JSON

if TYPE_CHECKING:
    from .context import Context
    from .core import WorkflowEngine
    from .handle import RunHandle

WorkflowFunction = Callable[..., Any]


class Workflow:
    """A registered workflow body: ``fn(ctx, input)`` (or ``fn(ctx)``)."""

    def __init__(self, engine: WorkflowEngine, fn: WorkflowFunction, name: str) -> None:
        self.engine = engine
        self.fn = fn
        self.name = name
        params = list(inspect.signature(fn).parameters.values())
        self._takes_input = len(params) >= 2 or any(p.kind in (p.VAR_POSITIONAL,) for p in params)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def run_body(self, ctx: Context, input: JSON) -> JSON:
        """Call the workflow function, passing ``input`` only if it takes one."""
        return self.fn(ctx, input) if self._takes_input else self.fn(ctx)

    def start(self, input: JSON = None, *, idempotency_key: str | None = None) -> RunHandle:
        """Start a run; with an ``idempotency_key`` already used, the first run."""
        return self.engine.start(self, input, idempotency_key=idempotency_key)

    def __repr__(self) -> str:
        return f"<Workflow {self.name}>"


class WorkflowRegistry:
    """Workflows by name: messages name a workflow, never carry code."""

    def __init__(self) -> None:
        self._by_name: dict[str, Workflow] = {}

    def add(self, workflow: Workflow) -> None:
        """Register a workflow; a different function under a taken name is refused."""
        existing = self._by_name.get(workflow.name)
        if existing is not None and existing.fn is not workflow.fn:
            raise ValueError(f"a different workflow is already registered as {workflow.name!r}")
        self._by_name[workflow.name] = workflow

    def get(self, name: str | Workflow) -> Workflow:
        """The workflow registered under ``name``; :class:`UnknownWorkflowError` if none."""
        if isinstance(name, Workflow):
            return self.get(name.name)
        try:
            return self._by_name[name]
        except (KeyError, TypeError):
            known = ", ".join(sorted(self._by_name)) or "none"
            raise UnknownWorkflowError(
                f"no workflow is registered as {name!r} (registered: {known})"
            ) from None

    def names(self) -> list[str]:
        """The registered workflow names, sorted."""
        return sorted(self._by_name)
