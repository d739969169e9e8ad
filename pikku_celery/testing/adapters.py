"""The test environment's adapters: its store, its lease keeper, its dispatcher, on its clock."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from celery import Celery

from ..celery.step_body import CeleryStepBody
from ..engine.dispatcher import Dispatcher
from ..engine.keeper import StepHolding, StepLeaseKeeper
from ..errors import UnknownTaskError
from ..model.values import uuid5_str
from ..ports.store import SettleWatch, WaitOnly
from ..store.memory import InMemoryWorkflowStore
from .clock import VirtualClock
from .inline import InlineDispatcher, Message

if TYPE_CHECKING:
    from .env import WorkflowTestEnv

HOSTNAME = "pikku-test-env@localhost"
"""The worker's name a step's request shows in the test environment."""


class WorkflowTestStore(InMemoryWorkflowStore):
    """The in-memory store on the environment's clock.

    Its ``settled_listener`` is how ``RunHandle.wait()`` drives the
    environment: each time the handle would wait, the queue is run until the
    run settles (or :class:`WorkflowStuckError` says why it cannot).
    """

    def __init__(self, env: WorkflowTestEnv) -> None:
        super().__init__(clock=env.clock.now_ms)
        self._env = env

    @contextmanager
    def settled_listener(self, run_id: str) -> Iterator[SettleWatch]:
        """Its ``wait(timeout)`` runs the environment until ``run_id`` settles."""

        def wait(_timeout: float) -> None:
            self._env.settle(run_id)

        yield WaitOnly(wait)


class InlineLeaseKeeper(StepLeaseKeeper):
    """Keeps step leases without a thread: the clock stands still while a step runs."""

    def hold(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> StepHolding:
        """The holding of a step's attempt; never renewed (its lease cannot lapse meanwhile)."""
        deadline = time.monotonic() + lease_ms / 1000
        return StepHolding(
            step_id, attempt, lease_ms, claim_id=claim_id, deadline=deadline, run_id=run_id
        )

    def drop(self, holding: StepHolding) -> None:
        """Stop holding (nothing to stop)."""
        holding.dropped = True


class WorkflowTestDispatcher(InlineDispatcher):
    """The inline dispatcher of a test environment, on its virtual clock.

    Knows your Celery app's tasks (a step runs ``task.run`` as a worker
    would) and the plain functions registered with :meth:`task`, which win
    over a Celery task of the same name. Queues come from the app's routes.
    A message's ``due`` is in epoch seconds on the virtual clock, and no
    countdown is too long to queue (nothing waits for the sweep).
    """

    def __init__(
        self,
        clock: VirtualClock,
        app: Celery | None = None,
        routes: Dispatcher | None = None,
        *,
        lease_ms: int = 30_000,
    ) -> None:
        super().__init__(lease_ms=lease_ms, max_countdown=math.inf, clock=clock.time)
        self.virtual_clock = clock
        self.app = app
        self.routes = routes

    # --- tasks ---------------------------------------------------------------
    def task_name(self, task: Any) -> str:
        name = task if isinstance(task, str) else getattr(task, "name", None)
        if isinstance(name, str) and name in self.tasks:
            return name
        app = self.app
        if app is not None and isinstance(name, str) and name in app.tasks:
            if name.startswith("pikku."):
                raise UnknownTaskError(f"pikku's own task {name!r} cannot be a workflow step")
            return name
        if app is not None:
            raise UnknownTaskError(
                f"{task!r} is not a task of Celery app {app.main!r}: decorate it with "
                "@app.task (and import its module), or register a plain function in the "
                "test environment with env.task(fn)"
            )
        raise UnknownTaskError(
            f"{task!r} is not a registered task: register it with env.task(fn) (or on the "
            "engine's own InlineDispatcher before entering the environment)"
        )

    def task_queue(self, task_name: str, route: dict[str, Any] | None = None) -> str | None:
        routes = self.routes
        own_queue = self.task_queues.get(task_name)
        if routes is not None and self._is_celery_task(task_name) and (route or not own_queue):
            return routes.task_queue(task_name, route)  # your app's own routing
        return super().task_queue(task_name, route)

    def _is_celery_task(self, task_name: str) -> bool:
        return self.app is not None and task_name in self.app.tasks

    # --- sending -------------------------------------------------------------
    def due_at(self, countdown: float) -> float:
        """Now plus ``countdown``, on the virtual clock, rounded up to the millisecond."""
        ms = self.virtual_clock.now_ms() + max(0, math.ceil(countdown * 1000 - 1e-6))
        return ms / 1000

    def peek(self) -> Message | None:
        """The next message due (the earliest; the first sent among equals), if any."""
        return self.messages[0] if self.messages else None

    # --- delivering ----------------------------------------------------------
    def deliver(self, msg: Message) -> None:
        """Handle one message as a worker would; a step of a Celery task runs its ``run``."""
        if msg.kind == "step" and msg.task_name not in self.tasks and self.app is not None:
            engine = self.engine
            assert engine is not None, "bind the dispatcher to an engine first"
            assert msg.step_id is not None and msg.task_name is not None
            if msg.task_name not in self.app.tasks:
                raise UnknownTaskError(
                    f"step {msg.step_id} of run {msg.run_id} names task {msg.task_name!r}, "
                    f"which Celery app {self.app.main!r} does not have"
                )
            body = CeleryStepBody(self.app, self._outer_request(msg))
            engine.execute_step(msg.run_id, msg.step_id, msg.task_name, body, msg.queue)
            return
        super().deliver(msg)

    def _outer_request(self, msg: Message) -> Any:
        """What ``pikku.run_step``'s own request would say about this message."""
        queue = msg.queue or (self.app.conf.task_default_queue if self.app else None) or "celery"
        return SimpleNamespace(
            id=uuid5_str(msg.run_id, f"test-env-message-{msg.seq}"),
            delivery_info={"exchange": "", "routing_key": queue, "redelivered": False},
            hostname=HOSTNAME,
            timelimit=(None, None),
        )

    def deliver_next(self, until: float = math.inf) -> bool:
        """Deliver the next message if it is due by ``until`` (epoch seconds),
        moving the clock to when it is due; False when there is none."""
        head = self.peek()
        if head is None or head.due > until:
            return False
        self.virtual_clock.advance_to(head.due)
        self.deliver(heapq.heappop(self.messages))
        return True

    def run_until_idle(
        self, timeout: float = 10.0, max_messages: int = 10_000, horizon: float = math.inf
    ) -> int:
        """Deliver messages in due order, skipping the clock to each one due
        within ``horizon`` seconds of now, until none is; later ones stay queued.

        ``timeout`` (real seconds) is kept for the inline dispatcher's
        signature: nothing here waits. Returns how many were delivered.
        """
        until = self.virtual_clock.time() + horizon
        delivered = 0
        while delivered < max_messages and self.deliver_next(until):
            delivered += 1
        return delivered
