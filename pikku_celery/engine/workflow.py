"""Workflow definitions and the registry that names them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, overload

from typing_extensions import TypeVar

from ..errors import UnknownWorkflowError
from ..store.model import JSON

if TYPE_CHECKING:
    from .context import Context
    from .core import WorkflowEngine
    from .handle import RunHandle

WorkflowFunction = Callable[..., Any]

# A workflow's input type: what ``start`` and ``ctx.child`` take. Contravariant,
# so a workflow whose input may be None (``fn(ctx)``, or ``input: X | None``)
# is also a ``Workflow[None, ...]`` and can be started with no input. The
# defaults make a bare ``Workflow`` mean ``Workflow[Any, Any]``, as it did
# before the class was generic (no "missing type parameters" under --strict).
In = TypeVar("In", contravariant=True, default=Any)
# A workflow's output type: what its handle's ``wait``/``result`` and
# ``ctx.child`` return. Outputs are stored as JSON, so a JSON-shaped type
# reads back as declared (a tuple would come back a list).
Out = TypeVar("Out", covariant=True, default=Any)
_In = TypeVar("_In")
_Out = TypeVar("_Out")


class Workflow(Generic[In, Out]):
    """A registered workflow body: ``fn(ctx, input)`` (or ``fn(ctx)``).

    Generic in its input and output types, as inferred from ``fn`` by
    :meth:`WorkflowEngine.workflow`: ``fn(ctx: Context, order: Order) -> Shipped``
    is a ``Workflow[Order, Shipped]`` and ``fn(ctx) -> Shipped`` a
    ``Workflow[None, Shipped]``.
    """

    def __init__(self, engine: WorkflowEngine, fn: Callable[..., Out], name: str) -> None:
        self.engine = engine
        # Final: read-only to the type checker, which is what makes In/Out's variance sound.
        self.fn: Final = fn
        self.name = name
        params = list(inspect.signature(fn).parameters.values())
        self._takes_input = len(params) >= 2 or any(p.kind in (p.VAR_POSITIONAL,) for p in params)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self.by_name_refusal: str | None = None
        """Why ``start`` refuses this workflow given by name (the web API, the
        CLI, a message), None when it does not: the durable canvas's built-in
        workflow would run any task its input names."""

    @property
    def by_name(self) -> bool:
        """Whether the workflow may be started by its name."""
        return self.by_name_refusal is None

    def run_body(self, ctx: Context, input: JSON) -> JSON:
        """Call the workflow function, passing ``input`` only if it takes one."""
        return self.fn(ctx, input) if self._takes_input else self.fn(ctx)

    @overload
    def start(self, input: In, *, idempotency_key: str | None = None) -> RunHandle[Out]: ...

    @overload
    def start(
        self: Workflow[None, Out], *, idempotency_key: str | None = None
    ) -> RunHandle[Out]: ...

    def start(self, input: Any = None, *, idempotency_key: str | None = None) -> RunHandle[Out]:
        """Start a run; with an ``idempotency_key`` already used, the first run.

        ``input`` may be left out only when the workflow's input may be None.
        """
        return self.engine.start(self, input, idempotency_key=idempotency_key)

    def __repr__(self) -> str:
        return f"<Workflow {self.name}>"


class WorkflowDecorator(Protocol):
    """What ``engine.workflow(name=...)`` returns: ``@workflow`` with the types inferred."""

    @overload
    def __call__(self, fn: Callable[[Context, _In], _Out], /) -> Workflow[_In, _Out]: ...

    @overload
    def __call__(self, fn: Callable[[Context], _Out], /) -> Workflow[None, _Out]: ...


class WorkflowRegistry:
    """Workflows by name: messages name a workflow, never carry code."""

    def __init__(self) -> None:
        self._by_name: dict[str, Workflow[Any, Any]] = {}

    def add(self, workflow: Workflow[Any, Any]) -> None:
        """Register a workflow; a different function under a taken name is refused."""
        existing = self._by_name.get(workflow.name)
        if existing is not None and existing.fn is not workflow.fn:
            raise ValueError(f"a different workflow is already registered as {workflow.name!r}")
        self._by_name[workflow.name] = workflow

    def get(self, name: str | Workflow[Any, Any]) -> Workflow[Any, Any]:
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
