"""The inline dispatcher: a broker-less, single-threaded stand-in for Celery.

``InlineDispatcher`` is deterministic: messages go into a local queue
(countdowns honoured in order, on the real clock) and ``run_until_idle``
delivers them to the engine one by one. Tests can drop messages to play a
lossy broker. ``make_engine`` builds an engine on in-memory adapters with one.
For your own Pikku, with time skipping, see :mod:`pikku_celery.testing.env`.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..engine.core import WorkflowEngine
from ..engine.execute import call_with
from ..engine.observe import run_trace
from ..errors import UnknownTaskError
from ..lease.memory import InMemoryLeaseService
from ..model.values import StepState
from ..ports.store import WorkflowStore
from ..store.memory import InMemoryWorkflowStore


@dataclass(order=True)
class Message:
    """A message in the inline queue: a step to run or a run to wake, due at ``due``."""

    due: float
    seq: int
    kind: str = field(compare=False)  # "step" or "run"
    run_id: str = field(compare=False)
    step_id: str | None = field(compare=False, default=None)
    task_name: str | None = field(compare=False, default=None)
    queue: str | None = field(compare=False, default=None)
    attempt: int = field(compare=False, default=0)
    reason: str = field(compare=False, default="")
    trace: dict[str, str] | None = field(compare=False, default=None)  # as a header carries it


class InlineDispatcher:
    """A broker-less dispatcher: plain functions as tasks, a local queue."""

    def __init__(
        self,
        *,
        lease_ms: int = 30_000,
        queue_leases: dict[str, int] | None = None,
        max_countdown: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        eager: bool = False,
    ) -> None:
        self.clock = clock  # seconds: when a message is due, on this clock
        self.eager = eager  # run a run's next step where the last one ran (eager steps)
        self.engine: WorkflowEngine | None = None
        self.tasks: dict[str, Callable[..., Any]] = {}
        self.task_queues: dict[str, str | None] = {}
        self.default_lease_ms = lease_ms
        self.queue_leases = dict(queue_leases or {})
        self.default_max_countdown = max_countdown
        self.messages: list[Message] = []
        self.sent: list[Message] = []
        self.drop: Callable[[Message], bool] | None = None
        self._seq = itertools.count()

    # --- tasks ---------------------------------------------------------------
    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
    ) -> Any:
        """Register ``fn`` as a task (usable bare or with ``name=``/``queue=``)."""

        def register(f: Callable[..., Any]) -> Callable[..., Any]:
            task_name = name or f.__name__
            self.tasks[task_name] = f
            self.task_queues[task_name] = queue
            f.name = task_name  # type: ignore[attr-defined]
            return f

        return register(fn) if fn is not None else register

    def task_name(self, task: Any) -> str:
        name = task if isinstance(task, str) else getattr(task, "name", None)
        if not isinstance(name, str) or name not in self.tasks:
            raise UnknownTaskError(f"{task!r} is not a registered task")
        return name

    def task_queue(self, task_name: str, route: dict[str, Any] | None = None) -> str | None:
        queue = (route or {}).get("queue")
        return str(queue) if queue else self.task_queues.get(task_name)

    def lease_ms(self, queue: str | None) -> int:
        return self.queue_leases.get(queue or "", self.default_lease_ms)

    def longest_lease_ms(self) -> int:
        return max([self.default_lease_ms, *self.queue_leases.values()])

    def max_countdown(self, queue: str | None) -> float:
        return self.default_max_countdown

    def eager_body(
        self, task_name: str, queue: str | None, carrier: Callable[[StepState], Any]
    ) -> Callable[[StepState], Any] | None:
        """With ``eager=True``, every registered task runs eagerly."""
        fn = self.tasks.get(task_name)
        return call_with(fn) if self.eager and fn is not None else None

    # --- sending -------------------------------------------------------------
    def due_at(self, countdown: float) -> float:
        """When a message sent now with ``countdown`` seconds is due, on :attr:`clock`."""
        return self.clock() + countdown

    def _push(self, msg: Message) -> None:
        msg.trace = run_trace.get()
        self.sent.append(msg)
        if self.drop is not None and self.drop(msg):
            return
        heapq.heappush(self.messages, msg)

    def send_step(self, step: StepState, countdown: float = 0.0) -> None:
        assert step.task_name is not None
        self._push(
            Message(
                self.due_at(countdown),
                next(self._seq),
                "step",
                step.run_id,
                step.id,
                step.task_name,
                step.queue,
                step.attempt,
            )
        )

    def wake_run(self, run_id: str, countdown: float = 0.0, reason: str = "") -> None:
        self._push(Message(self.due_at(countdown), next(self._seq), "run", run_id, reason=reason))

    # --- delivering ----------------------------------------------------------
    def deliver(self, msg: Message) -> None:
        """Handle one message as a worker would: a pass of the run, or the step's task."""
        engine = self.engine
        assert engine is not None, "bind the dispatcher to an engine first"
        if msg.kind == "run":
            engine.orchestrate(msg.run_id, msg.reason, trace=msg.trace)
            return
        assert msg.step_id is not None and msg.task_name is not None
        fn = self.tasks.get(msg.task_name)
        if fn is None:
            raise UnknownTaskError(f"no task {msg.task_name!r}")
        engine.execute_step(
            msg.run_id, msg.step_id, msg.task_name, call_with(fn), msg.queue, trace=msg.trace
        )

    def run_until_idle(
        self, timeout: float = 10.0, max_messages: int = 10_000, horizon: float = 2.0
    ) -> int:
        """Deliver messages (waiting out countdowns) until none is due within
        ``horizon`` seconds; later ones stay queued.

        Returns how many were delivered; raises ``TimeoutError`` if the queue
        never drains within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        delivered = 0
        while self.messages and delivered < max_messages:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.messages)} message(s) still queued")
            wait = self.messages[0].due - self.clock()
            if wait > horizon:
                break
            if wait > 0:
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))  # a countdown
                continue
            self.deliver(heapq.heappop(self.messages))
            delivered += 1
        return delivered


def make_engine(
    store: WorkflowStore | None = None,
    dispatcher: InlineDispatcher | None = None,
    **options: Any,
) -> tuple[WorkflowEngine, InlineDispatcher]:
    """An engine on in-memory adapters (or the given store) with an inline dispatcher."""
    dispatcher = dispatcher or InlineDispatcher()
    engine = WorkflowEngine(
        store or InMemoryWorkflowStore(), InMemoryLeaseService(), dispatcher, **options
    )
    dispatcher.engine = engine
    return engine, dispatcher
