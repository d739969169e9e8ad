"""Workflow definitions and the registry that names them."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, overload

from typing_extensions import TypeVar

from ..errors import UnknownWorkflowError
from ..model.values import JSON
from .versions import explicit_version, source_version, version_order

if TYPE_CHECKING:
    from datetime import timedelta

    from .concurrency import Concurrency
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

    def __init__(
        self,
        engine: WorkflowEngine,
        fn: Callable[..., Out],
        name: str,
        version: str | int | None = None,
        *,
        eager_steps: bool = True,
        concurrency: Concurrency | None = None,
        timeout_ms: int | None = None,
    ) -> None:
        self.engine = engine
        self.eager_steps = eager_steps
        """Whether its steps may run eagerly (``@pikku.workflow(eager_steps=False)``)."""
        self.timeout_ms = timeout_ms
        """Each run's deadline, this long after it starts (``@pikku.workflow(timeout=)``)."""
        self.concurrency = concurrency
        """How many of its runs may run at once per key (None: no limit); see
        :class:`~pikku_celery.Concurrency`."""
        # Final: read-only to the type checker, which is what makes In/Out's variance sound.
        self.fn: Final = fn
        self.name = name
        self.pinned = version is not None
        """Whether the version was given (it pins its runs) rather than hashed."""
        self.version = explicit_version(version) if version is not None else source_version(fn)
        """What each run started on this body records: ``version=``, else
        ``src:`` and a hash of the body's source (see :mod:`.versions`)."""
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
    def start(
        self,
        input: In,
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[Out]: ...

    @overload
    def start(
        self: Workflow[None, Out],
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[Out]: ...

    def start(
        self,
        input: Any = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[Out]:
        """Start a run; with an ``idempotency_key`` already used, the first run.

        ``input`` may be left out only when the workflow's input may be None.
        A new run starts on the newest version registered under this name,
        whichever version's object it is called on. ``timeout`` overrides
        the workflow's own deadline for this run.
        """
        return self.engine.start(self, input, idempotency_key=idempotency_key, timeout=timeout)

    def __repr__(self) -> str:
        shown = f" version {self.version}" if self.pinned else ""
        return f"<Workflow {self.name}{shown}>"


class WorkflowDecorator(Protocol):
    """What ``engine.workflow(name=...)`` returns: ``@workflow`` with the types inferred."""

    @overload
    def __call__(self, fn: Callable[[Context, _In], _Out], /) -> Workflow[_In, _Out]: ...

    @overload
    def __call__(self, fn: Callable[[Context], _Out], /) -> Workflow[None, _Out]: ...


class WorkflowRegistry:
    """Workflows by name and version: messages name a workflow, never carry code.

    A name holds either one body without a version or any number of
    explicitly versioned ones; the newest (the highest version, see
    :func:`~.versions.version_order`) is the one new runs start on.
    """

    def __init__(self, loader: Callable[[], str] | None = None) -> None:
        self._by_name: dict[str, list[Workflow[Any, Any]]] = {}
        self.loader = loader
        """Imports the modules that define workflows (Celery's task modules);
        called once, at the first name not found or the first listing, and
        returns where it looked."""
        self._looked: str | None = None
        self._loading = threading.RLock()

    def load(self) -> str | None:
        """Run :attr:`loader` unless it ran; where it looked (None: no loader).

        A loader that raises runs again at the next call. A lookup made
        while it imports (by a module it imports) does not start it again.
        """
        with self._loading:  # another thread waits for the import under way
            if self._looked is not None or self.loader is None:
                return self._looked
            loader, self.loader = self.loader, None  # not again from inside it
            try:
                self._looked = loader()
            except BaseException:
                self.loader = loader
                raise
            return self._looked

    def add(self, workflow: Workflow[Any, Any]) -> None:
        """Register a workflow; a different function under a taken name and
        version, or a body without a version beside versioned ones, is refused."""
        bodies = self._by_name.setdefault(workflow.name, [])
        for i, existing in enumerate(bodies):
            if existing.fn is workflow.fn:
                bodies[i] = workflow
                return
        if bodies and not (workflow.pinned and bodies[0].pinned):
            if not workflow.pinned and not bodies[0].pinned:
                raise ValueError(
                    f"a different workflow is already registered as {workflow.name!r} "
                    "(to keep several bodies under one name, give each a version=)"
                )
            raise ValueError(
                f"workflow {workflow.name!r}: give every body registered under it a "
                "version= (one without a version cannot be told apart from the others)"
            )
        if any(existing.version == workflow.version for existing in bodies):
            raise ValueError(
                f"a different workflow is already registered as {workflow.name!r} "
                f"version {workflow.version!r}"
            )
        bodies.append(workflow)
        bodies.sort(key=lambda wf: version_order(wf.version), reverse=True)

    def get(self, name: str | Workflow[Any, Any]) -> Workflow[Any, Any]:
        """The newest version registered under ``name``; :class:`UnknownWorkflowError` if none."""
        if isinstance(name, Workflow):
            return self.get(name.name)
        return self.versions(name)[0]

    def versions(self, name: str) -> list[Workflow[Any, Any]]:
        """Every version registered under ``name``, newest first;
        :class:`UnknownWorkflowError` (naming where it looked) if none."""
        if not isinstance(name, str) or not self.known(name):
            looked = self.load()
            where = f"; looked in {looked}" if looked else ""
            known = ", ".join(sorted(self._by_name)) or "none"
            raise UnknownWorkflowError(
                f"no workflow is registered as {name!r} (registered: {known}){where}"
            )
        return list(self._by_name[name])

    def known(self, name: str) -> bool:
        """Whether a workflow is registered as ``name`` (loading the modules
        that define workflows first, if it is not yet)."""
        if name not in self._by_name:
            self.load()
        return name in self._by_name

    def names(self) -> list[str]:
        """The registered workflow names, sorted (the modules that define
        workflows loaded first)."""
        self.load()
        return sorted(self._by_name)
