"""The test environment's own engine: your workflows and options over the environment's adapters.

The environment never swaps the ports of your engine: a worker thread, a
cache or anything else that holds them keeps the real ones. It builds an
engine of its own over your engine's registry, schedules, observers and
options, and for the duration of the ``with`` your engine's entry points
(:data:`FORWARDED`: ``start``, ``send_signal``, ``handle``...) are that
engine's, so ``fulfil_order.start(...)`` and ``pikku.send_signal(...)``
reach the environment. Leaving puts your engine's own methods back.
"""

from __future__ import annotations

from types import TracebackType

from ..engine.core import WorkflowEngine
from ..engine.dispatcher import Dispatcher
from ..engine.keeper import StepLeaseKeeper
from ..ports.lease import LeaseService
from ..ports.store import WorkflowStore

FORWARDED = (
    "start",
    "handle",
    "send_signal",
    "cancel",
    "retry",
    "sweep",
    "run_schedules",
    "orchestrate",
    "execute_step",
)
"""Your engine's entry points that reach the environment's engine while it is active."""

OPTIONS = (
    "orchestration_queue",
    "run_lease_ttl",
    "sweep_lease_ttl",
    "sweep_backoff",
    "message_grace",
    "idle_after",
    "max_input_bytes",
    "outcome_retry",
    "outage_timeout",
    "sweep_max_backoff",
    "eager_steps",
    "eager_max_steps",
    "eager_max_seconds",
    "max_lease",
)
"""The options of :class:`WorkflowEngine` carried over by name (the limits go whole)."""

_MISSING = object()


def engine_like(
    live: WorkflowEngine,
    store: WorkflowStore,
    leases: LeaseService,
    dispatcher: Dispatcher,
    keeper: StepLeaseKeeper,
) -> WorkflowEngine:
    """A new engine on these adapters with ``live``'s workflows, schedules,
    observers, limits, retention and options."""
    options = {name: getattr(live, name) for name in OPTIONS}
    own = WorkflowEngine(store, leases, dispatcher, worker_id=live.worker_id, **options)
    own.registry = live.registry
    own.schedules = live.schedules
    own.observers = live.observers
    own.limits = live.limits
    own.retention = live.retention
    own.keeper = keeper
    return own


class Forwarding:
    """While held, ``live``'s entry points (:data:`FORWARDED`) are ``target``'s."""

    def __init__(self, live: WorkflowEngine, target: WorkflowEngine) -> None:
        self.live = live
        self.target = target
        self._saved: dict[str, object] | None = None

    def __enter__(self) -> Forwarding:
        own = vars(self.live)
        self._saved = {name: own.get(name, _MISSING) for name in FORWARDED}
        for name in FORWARDED:
            setattr(self.live, name, getattr(self.target, name))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        saved, self._saved = self._saved, None
        for name, value in (saved or {}).items():
            if value is _MISSING:
                delattr(self.live, name)
            else:
                setattr(self.live, name, value)
