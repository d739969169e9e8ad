"""Dispatcher adapters for the shared conformance suite, behind one harness.

Each harness gives the suite the same things for every adapter: the
dispatcher under test, a way to register a task workers can run, a way to
build a fresh dispatcher with given queue leases, and a real consumer whose
deliveries reach a recording engine. What a worker delivers is observed only
through the port's effect on the engine side: each step message is one
``execute_step(run_id, step_id, task_name, ..., queue)`` and each wake-up
one ``orchestrate(run_id, reason)``, recorded with the time it arrived.

* ``celery``: ``Pikku(app, ...)`` on the ``memory://`` broker, consumed by
  Celery's in-process test worker (one per module, solo pool, 10 ms polling).
* ``inline``: ``InlineDispatcher`` delivered by its own ``run_until_idle``.
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from celery import Celery

from pikku_celery import Pikku
from pikku_celery.engine.core import WorkflowEngine
from pikku_celery.engine.dispatcher import Dispatcher
from pikku_celery.engine.execute import StepBody
from pikku_celery.lease import InMemoryLeaseService
from pikku_celery.model.values import StepKind, StepState, StepStatus
from pikku_celery.store import InMemoryWorkflowStore
from pikku_celery.testing.inline import InlineDispatcher
from tests.helpers import in_process_worker, memory_broker_config, wait_until

T = TypeVar("T")

ADAPTERS = ["celery", "inline"]

# The leases (ms) of the module's delivering dispatcher: two configured queues
# around the default one.
FAST_LEASE_MS = 3_000
DEFAULT_LEASE_MS = 5_000
SLOW_LEASE_MS = 9_000


def new_id() -> str:
    return str(uuid.uuid4())


def new_name(prefix: str = "conformance") -> str:
    """A task (or queue) name no other test uses."""
    return f"{prefix}.{uuid.uuid4().hex[:12]}"


# --- what the engine side sees ------------------------------------------------


@dataclass(frozen=True)
class StepDelivery:
    """One ``execute_step`` a delivered step message made, and when."""

    run_id: str
    step_id: str
    task_name: str
    queue: str | None
    at: float  # time.monotonic()
    trace: dict[str, str] | None = None  # the trace context the message carried


@dataclass(frozen=True)
class WakeDelivery:
    """One ``orchestrate`` a delivered wake-up made, and when."""

    run_id: str
    reason: str
    at: float  # time.monotonic()
    trace: dict[str, str] | None = None


class Recorder:
    """Deliveries as the engine receives them (from any worker thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: list[StepDelivery] = []
        self._wakes: list[WakeDelivery] = []

    def step(
        self,
        run_id: str,
        step_id: str,
        task_name: str,
        queue: str | None,
        trace: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            self._steps.append(
                StepDelivery(run_id, step_id, task_name, queue, time.monotonic(), trace)
            )

    def wake(self, run_id: str, reason: str, trace: dict[str, str] | None = None) -> None:
        with self._lock:
            self._wakes.append(WakeDelivery(run_id, reason, time.monotonic(), trace))

    def steps_of(self, run_id: str) -> list[StepDelivery]:
        with self._lock:
            return [d for d in self._steps if d.run_id == run_id]

    def wakes_of(self, run_id: str) -> list[WakeDelivery]:
        with self._lock:
            return [d for d in self._wakes if d.run_id == run_id]


class Recording:
    """Worker-side entry points that only record what was delivered."""

    recorder: Recorder

    def orchestrate(
        self, run_id: str, reason: str = "", *, trace: dict[str, str] | None = None
    ) -> None:
        self.recorder.wake(run_id, reason, trace)

    def execute_step(
        self,
        run_id: str,
        step_id: str,
        task_name: str,
        body: StepBody,
        queue: str | None = None,
        *,
        trace: dict[str, str] | None = None,
        delivery: Any = None,
    ) -> Any:
        self.recorder.step(run_id, step_id, task_name, queue, trace)
        return None


class RecordingPikku(Recording, Pikku):
    """Pikku, recording its deliveries."""


class RecordingEngine(Recording, WorkflowEngine):
    """A plain engine, recording its deliveries."""


# --- adapters and harnesses -----------------------------------------------------


@dataclass
class Adapter:
    """One dispatcher of an adapter, with the way to register its tasks."""

    dispatcher: Dispatcher
    # The queue ``task_queue`` names for a task that declares none. Celery
    # names the app's default queue; the inline dispatcher has no broker
    # queues and answers None ("only the broker knows"), which the port allows.
    default_queue: str | None
    _register: Callable[[str, str | None], Any]

    def register_task(self, name: str, queue: str | None = None) -> Any:
        """Register a task workers can run (declaring its own queue, if given);
        return the task object."""
        return self._register(name, queue)


@dataclass
class Harness(ABC):
    """An adapter under test with a consumer: the same interface for each."""

    name: str
    adapter: Adapter
    recorder: Recorder
    fast_queue: str  # configured lease FAST_LEASE_MS
    slow_queue: str  # configured lease SLOW_LEASE_MS
    other_queue: str  # no lease configured: the default one
    # Whether max_countdown stays below the queue's lease. On Celery a
    # countdown must end before the broker redelivers the message (Redis/SQS
    # visibility timeout, RabbitMQ consumer timeout). No broker redelivers an
    # inline message, so the inline dispatcher's max_countdown is a fixed
    # setting, independent of the lease (3600 s against 30 s by default).
    countdown_within_lease: bool

    @property
    def dispatcher(self) -> Dispatcher:
        return self.adapter.dispatcher

    def register_task(self, name: str, queue: str | None = None) -> Any:
        return self.adapter.register_task(name, queue)

    @abstractmethod
    def build(self, queue_leases_ms: dict[str, int], default_lease_ms: int) -> Adapter:
        """A fresh dispatcher of this adapter with these queue leases (no consumer)."""

    @abstractmethod
    def pump(self) -> None:
        """Let the consumer deliver what is due now (a worker thread needs nothing)."""

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0) -> T:
        """Deliver until ``predicate`` is truthy; fail after ``timeout`` seconds."""

        def check() -> T:
            self.pump()
            return predicate()

        return wait_until(check, timeout)

    def step(self, task_name: str, route: dict[str, Any] | None = None) -> StepState:
        """A scheduled task step as the engine records it: its queue is the
        dispatcher's ``task_queue`` of its task and route."""
        return StepState(
            id=new_id(),
            run_id=new_id(),
            name=new_name("step"),
            seq=0,
            kind=StepKind.TASK,
            status=StepStatus.SCHEDULED,
            task_name=task_name,
            queue=self.dispatcher.task_queue(task_name, route),
            route=route,
        )

    def settle(self, task_name: str, route: dict[str, Any] | None = None) -> None:
        """Wait until everything sent so far (without countdown) to the wake-up
        queue and to the queue of ``route`` has been delivered: a barrier
        message sent last on each is delivered after them (one consumer, FIFO
        per queue)."""
        barrier = self.step(task_name, route)
        wake = new_id()
        self.dispatcher.send_step(barrier)
        self.dispatcher.wake_run(wake, reason="barrier")
        self.wait_for(
            lambda: self.recorder.steps_of(barrier.run_id) and self.recorder.wakes_of(wake)
        )


# --- Celery ---------------------------------------------------------------------


def celery_app(default_queue: str, routes: dict[str, dict[str, Any]]) -> Celery:
    """An app on the memory broker whose ``task_routes`` router reads ``routes``."""

    def route(name: str, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        return routes.get(name)

    app = Celery(f"dispatcher-{default_queue}", set_as_current=False)
    app.conf.update(
        memory_broker_config(default_queue),
        task_routes=(route,),
        worker_hijack_root_logger=False,
    )
    return app


def celery_register(
    app: Celery, routes: dict[str, dict[str, Any]]
) -> Callable[[str, str | None], Any]:
    def register(name: str, queue: str | None) -> Any:
        # A task's own queue is declared through task_routes, as Celery asks
        # (its Task.queue attribute is deprecated, and pikku does not read it).
        if queue is not None:
            routes[name] = {"queue": queue}

        def task(*args: Any, **kwargs: Any) -> None:
            return None

        return app.task(name=name, shared=False)(task)

    return register


def celery_adapter(
    pikku_cls: type[Pikku], queue_leases_ms: dict[str, int], default_lease_ms: int
) -> tuple[Pikku, Adapter]:
    default_queue = new_name("celery")
    routes: dict[str, dict[str, Any]] = {}
    app = celery_app(default_queue, routes)
    pikku = pikku_cls(
        app,
        store=InMemoryWorkflowStore(),
        queue_leases={q: ms / 1000 for q, ms in queue_leases_ms.items()},
        default_lease=default_lease_ms / 1000,
        install_beat=False,
    )
    return pikku, Adapter(pikku.dispatcher, default_queue, celery_register(app, routes))


@dataclass
class CeleryHarness(Harness):
    def build(self, queue_leases_ms: dict[str, int], default_lease_ms: int) -> Adapter:
        return celery_adapter(Pikku, queue_leases_ms, default_lease_ms)[1]

    def pump(self) -> None:
        return None  # the in-process worker delivers in its own thread


@contextmanager
def celery_harness() -> Iterator[CeleryHarness]:
    recorder = Recorder()
    fast, slow, other = new_name("fast"), new_name("slow"), new_name("other")
    pikku, adapter = celery_adapter(
        RecordingPikku, {fast: FAST_LEASE_MS, slow: SLOW_LEASE_MS}, DEFAULT_LEASE_MS
    )
    assert isinstance(pikku, RecordingPikku)
    pikku.recorder = recorder
    assert adapter.default_queue is not None
    # Queue names are unique: the memory transport's queues are process-wide.
    with in_process_worker(
        pikku.app,
        pool="solo",
        concurrency=1,
        perform_ping_check=False,
        queues=(adapter.default_queue, fast, slow, other),
        loglevel="WARNING",
    ):
        yield CeleryHarness(
            "celery",
            adapter,
            recorder,
            fast,
            slow,
            other,
            countdown_within_lease=True,
        )


# --- inline ---------------------------------------------------------------------


def inline_register(dispatcher: InlineDispatcher) -> Callable[[str, str | None], Any]:
    def register(name: str, queue: str | None) -> Any:
        def task(*args: Any, **kwargs: Any) -> None:
            return None

        return dispatcher.task(task, name=name, queue=queue)

    return register


def inline_adapter(queue_leases_ms: dict[str, int], default_lease_ms: int) -> Adapter:
    dispatcher = InlineDispatcher(lease_ms=default_lease_ms, queue_leases=queue_leases_ms)
    return Adapter(dispatcher, None, inline_register(dispatcher))


@dataclass
class InlineHarness(Harness):
    def build(self, queue_leases_ms: dict[str, int], default_lease_ms: int) -> Adapter:
        return inline_adapter(queue_leases_ms, default_lease_ms)

    def pump(self) -> None:
        dispatcher = self.adapter.dispatcher
        assert isinstance(dispatcher, InlineDispatcher)
        # Deliver what is due, waiting out countdowns due within 50 ms.
        dispatcher.run_until_idle(timeout=5.0, horizon=0.05)


def inline_harness() -> InlineHarness:
    recorder = Recorder()
    fast, slow, other = new_name("fast"), new_name("slow"), new_name("other")
    adapter = inline_adapter({fast: FAST_LEASE_MS, slow: SLOW_LEASE_MS}, DEFAULT_LEASE_MS)
    dispatcher = adapter.dispatcher
    assert isinstance(dispatcher, InlineDispatcher)
    engine = RecordingEngine(InMemoryWorkflowStore(), InMemoryLeaseService(), dispatcher)
    engine.recorder = recorder
    dispatcher.engine = engine
    return InlineHarness(
        "inline", adapter, recorder, fast, slow, other, countdown_within_lease=False
    )


@pytest.fixture(scope="module", params=ADAPTERS)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """Each adapter with its consumer, once per module."""
    if request.param == "celery":
        with celery_harness() as celery:
            yield celery
    else:
        yield inline_harness()


@pytest.fixture(scope="module")
def plain_task(harness: Harness) -> str:
    """A task registered with the module's dispatcher, declaring no queue."""
    name = new_name()
    harness.register_task(name)
    return name


@pytest.fixture(scope="module")
def slow_task(harness: Harness) -> str:
    """A task registered with the module's dispatcher, declaring the slow queue."""
    name = new_name()
    harness.register_task(name, queue=harness.slow_queue)
    return name
