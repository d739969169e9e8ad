"""A time-skipping test environment for your own workflows (after Temporal's).

``workflow_test_env(pikku)`` takes *your* :class:`~pikku_celery.Pikku` (or
any :class:`~pikku_celery.engine.WorkflowEngine`) and, for the duration of a
``with``, swaps its store, leases, dispatcher and step-lease keeper for
in-memory ones on a :class:`VirtualClock`; on leaving, the real ones are put
back. Inside, your own code runs unchanged: ``fulfil_order.start(...)``,
``pikku.send_signal(...)`` and ``RunHandle.wait()`` reach the test
environment, every workflow registered on that Pikku is there, and no broker
message is sent and no database touched.

* Steps run your real Celery tasks (from ``pikku.app.tasks``) the way a
  worker does (:class:`~pikku_celery.celery.step_body.CeleryStepBody`): a
  ``bind=True`` task sees ``self.request.id`` (a stable id per attempt) and
  ``self.request.retries`` (the attempts so far), and ``self.retry()``
  becomes the step's retry. Plain functions registered with
  :meth:`WorkflowTestEnv.task` are tasks too (and stand in for a Celery task
  of the same name).
* Time skipping: whenever nothing is due now, the clock jumps to the next
  due message, so ``ctx.sleep("x", 3600)``, retry delays and signal timeouts
  take no time. ``env.advance(seconds)`` moves it explicitly.
* ``handle.wait()`` drives the queue until the run settles, or raises
  :class:`WorkflowStuckError` saying why it cannot (a signal nobody sent, a
  message dropped, a workflow that never ends).
* Tasks your code sends itself (``some_task.delay()``) are recorded in
  :attr:`WorkflowTestEnv.sent_tasks`, not published.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace, TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from celery import Celery
from celery.result import AsyncResult

from ..celery.integration import Pikku
from ..celery.step_body import CeleryStepBody
from ..engine.core import WorkflowEngine
from ..engine.dispatcher import Dispatcher
from ..engine.handle import RunHandle
from ..engine.keeper import StepHolding, StepLeaseKeeper
from ..engine.sweep import SweepReport
from ..errors import UnknownTaskError, WorkflowTimeoutError
from ..lease.memory import InMemoryLeaseService
from ..names import SIGNAL_PREFIX
from ..store.base import SettleWatch, WaitOnly
from ..store.memory import InMemoryWorkflowStore
from ..store.model import JSON, RunState, RunStatus, StepKind, StepState, StepStatus, uuid5_str
from .inline import InlineDispatcher, Message

P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """What ``env.task(name=...)`` returns: a decorator keeping the function's type."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


DEFAULT_MAX_MESSAGES = 10_000
HOSTNAME = "pikku-test-env@localhost"


class WorkflowStuckError(WorkflowTimeoutError):
    """A run cannot settle in the test environment: the message says why.

    Raised by ``handle.wait()`` and :meth:`WorkflowTestEnv.wait` when nothing
    is queued and no timer is due while the run is still open (it waits for a
    signal nobody sent, say), and by every driving method once it delivered
    ``max_messages`` messages without getting there (a workflow that never
    ends). ``run_id`` names the run, when there is one.
    """

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class VirtualClock:
    """The test environment's clock: it stands still until moved, never back.

    Starts at the real time (or ``start``: an aware datetime or epoch
    seconds); only :meth:`advance` and :meth:`advance_to` move it. The store,
    the leases and the dispatcher's queue all read it.
    """

    def __init__(self, start: datetime | float | None = None) -> None:
        if start is None:
            ms = time.time_ns() // 1_000_000
        elif isinstance(start, datetime):
            if start.tzinfo is None:
                raise ValueError("VirtualClock(start=...): give an aware datetime (e.g. UTC)")
            ms = round(start.timestamp() * 1000)
        else:
            ms = round(float(start) * 1000)
        self._ms = ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        """Now, in epoch milliseconds (what the store keeps)."""
        with self._lock:
            return self._ms

    def time(self) -> float:
        """Now, in epoch seconds (what the dispatcher's queue is ordered by)."""
        return self.now_ms() / 1000

    def now(self) -> datetime:
        """Now, as an aware UTC datetime."""
        return datetime.fromtimestamp(self.now_ms() / 1000, tz=UTC)

    def advance(self, seconds: float | timedelta) -> None:
        """Move the clock ``seconds`` forward (nothing runs: see ``WorkflowTestEnv.advance``)."""
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if not value >= 0:
            raise ValueError(f"the clock only moves forward, not by {seconds!r}")
        with self._lock:
            self._ms += math.ceil(value * 1000)

    def advance_to(self, epoch_seconds: float) -> None:
        """Move the clock to ``epoch_seconds`` if that is later than now."""
        self.advance_to_ms(math.ceil(epoch_seconds * 1000 - 0.01))

    def advance_to_ms(self, epoch_ms: int) -> None:
        """Move the clock to ``epoch_ms`` if that is later than now."""
        with self._lock:
            self._ms = max(self._ms, int(epoch_ms))


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
        self, step_id: str, attempt: int, lease_ms: int, claim_id: str | None = None
    ) -> StepHolding:
        """The holding of a step's attempt; never renewed (its lease cannot lapse meanwhile)."""
        deadline = time.monotonic() + lease_ms / 1000
        return StepHolding(step_id, attempt, lease_ms, claim_id=claim_id, deadline=deadline)

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


@dataclass(frozen=True)
class SentTask:
    """A task your code sent inside the environment (``.delay()``), recorded, not published."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    task_id: str
    options: dict[str, Any] = field(default_factory=dict)


_active_lock = threading.Lock()
_active: dict[int, WorkflowTestEnv] = {}


class WorkflowTestEnv:
    """Your engine on in-memory adapters and a virtual clock, while inside ``with``.

    ``engine`` is your :class:`~pikku_celery.Pikku` or any
    :class:`~pikku_celery.engine.WorkflowEngine`; its workflows, options and
    Celery app are used as they are. ``start`` sets the clock's start (an
    aware datetime or epoch seconds; default: now). ``max_messages`` bounds
    every driving call (a workflow that never ends raises
    :class:`WorkflowStuckError` instead of looping). ``lease`` is the step
    lease in seconds (the clock stands still while a step runs, so it never
    lapses on its own).

    The store, leases and dispatcher exist from construction, so a run's
    history stays readable (``env.store``) after the ``with``. Drive it from
    one thread (the test's): while it is active, the engine is the
    environment's for every thread of the process.
    """

    def __init__(
        self,
        engine: WorkflowEngine,
        *,
        start: datetime | float | None = None,
        max_messages: int = DEFAULT_MAX_MESSAGES,
        lease: float = 30.0,
    ) -> None:
        if not isinstance(engine, WorkflowEngine):
            raise TypeError(
                f"workflow_test_env needs your Pikku (or a WorkflowEngine), not {engine!r}"
            )
        if max_messages < 1:
            raise ValueError(f"max_messages must be positive, got {max_messages!r}")
        self.engine = engine
        self.max_messages = max_messages
        self.clock = VirtualClock(start)
        self.store = WorkflowTestStore(self)
        self.leases = InMemoryLeaseService(clock=self.clock.now_ms)
        self.app: Celery | None = engine.app if isinstance(engine, Pikku) else None
        original = engine.dispatcher
        self.dispatcher = WorkflowTestDispatcher(
            self.clock,
            self.app,
            original if self.app is not None else None,
            lease_ms=max(1, round(lease * 1000)),
        )
        if isinstance(original, InlineDispatcher):
            # A plain engine's inline tasks (make_engine's) are tasks here too.
            self.dispatcher.tasks.update(original.tasks)
            self.dispatcher.task_queues.update(original.task_queues)
        self.dispatcher.engine = engine
        self.keeper = InlineLeaseKeeper(self.store)
        self.sent_tasks: list[SentTask] = []
        self._started_ms = self.clock.now_ms()
        self._saved: tuple[Any, Any, Any, Any] | None = None
        self._saved_send: Any = None

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return f"<WorkflowTestEnv {state} on {self.engine!r} at {self.now.isoformat()}>"

    # --- entering and leaving ------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether the engine is swapped onto this environment now."""
        return self._saved is not None

    def __enter__(self) -> WorkflowTestEnv:
        engine = self.engine
        with _active_lock:
            other = _active.get(id(engine))
            if other is not None:
                raise RuntimeError(
                    f"{engine!r} is already inside a workflow_test_env ({other!r}); "
                    "environments on one engine do not nest"
                )
            _active[id(engine)] = self
        self._saved = (engine.store, engine.leases, engine.dispatcher, engine.keeper)
        engine.store = self.store
        engine.leases = self.leases
        engine.dispatcher = self.dispatcher
        engine.keeper = self.keeper
        if self.app is not None:
            self._saved_send = self.app.__dict__.get("send_task", _MISSING)
            self.app.send_task = self._record_send
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Put the engine's own store, leases, dispatcher and keeper back (idempotent)."""
        if self._saved is None:
            return
        engine = self.engine
        engine.store, engine.leases, engine.dispatcher, engine.keeper = self._saved
        self._saved = None
        if self.app is not None:
            if self._saved_send is _MISSING:
                self.app.__dict__.pop("send_task", None)
            else:
                self.app.send_task = self._saved_send
        with _active_lock:
            if _active.get(id(engine)) is self:
                del _active[id(engine)]

    def _record_send(
        self,
        name: str,
        args: Any = None,
        kwargs: Any = None,
        countdown: Any = None,
        eta: Any = None,
        **options: Any,
    ) -> AsyncResult:
        """``app.send_task`` inside the environment: recorded in :attr:`sent_tasks`."""
        if countdown is not None:
            options["countdown"] = countdown
        if eta is not None:
            options["eta"] = eta
        task_id = str(options.pop("task_id", None) or uuid.uuid4())
        self.sent_tasks.append(
            SentTask(name, tuple(args or ()), dict(kwargs or {}), task_id, options)
        )
        assert self.app is not None
        return AsyncResult(task_id, app=self.app)

    # --- time ----------------------------------------------------------------
    @property
    def now(self) -> datetime:
        """The environment's time, an aware UTC datetime."""
        return self.clock.now()

    @property
    def now_ms(self) -> int:
        """The environment's time in epoch milliseconds (the store's clock)."""
        return self.clock.now_ms()

    @property
    def elapsed(self) -> float:
        """Seconds the environment's clock moved since it was made (skipped ones too)."""
        return (self.clock.now_ms() - self._started_ms) / 1000

    def advance(self, seconds: float | timedelta, *, max_messages: int | None = None) -> int:
        """Let ``seconds`` pass: deliver, in order and each at its time, every
        message that comes due meanwhile, then leave the clock at the end.

        Returns how many messages were delivered.
        """
        value = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
        if not value >= 0:
            raise ValueError(f"time only moves forward, not by {seconds!r}")
        end_ms = self.clock.now_ms() + math.ceil(value * 1000)
        delivered = self._drive(None, end_ms / 1000, max_messages, "advance")
        self.clock.advance_to_ms(end_ms)
        return delivered

    # --- driving -------------------------------------------------------------
    def run_until_idle(self, *, skip_time: bool = True, max_messages: int | None = None) -> int:
        """Deliver messages until none is left, skipping the clock to each one
        due later; with ``skip_time=False``, only what is due now (and what
        that makes due now), leaving timers and retries queued.

        Idle is not settled: a run waiting for a signal is idle. Note that
        skipping fires signal timeouts too: send a signal first (it is kept
        until the run asks), or stop at the wait with :meth:`run_until_waiting`.
        Returns how many messages were delivered.
        """
        until = math.inf if skip_time else self.clock.time()
        return self._drive(None, until, max_messages, "run_until_idle")

    def run_until(
        self,
        condition: Callable[[], bool],
        *,
        skip_time: bool = True,
        max_messages: int | None = None,
    ) -> bool:
        """Deliver messages (skipping time unless told not to) until
        ``condition()`` holds or nothing is left; whether it holds."""
        until = math.inf if skip_time else self.clock.time()
        self._drive(condition, until, max_messages, "run_until")
        return bool(condition())

    def run_until_waiting(
        self, run: RunHandle | str, signal: str, *, max_messages: int | None = None
    ) -> None:
        """Run until ``run`` waits for ``signal`` (skipping sleeps and retries
        on the way, but stopping before that signal's own timeout fires).

        Raises :class:`WorkflowStuckError` if the run settles, or stops, without
        ever waiting for it.
        """
        run_id = _run_id(run)
        self.run_until(
            lambda: signal in self.waiting_for(run_id) or self._settled(run_id),
            max_messages=max_messages,
        )
        if signal in self.waiting_for(run_id):
            return
        state = self._run(run_id)
        terminal = state.status.terminal
        detail = f"it ended {state.status} first" if terminal else self.explain(run_id)
        raise WorkflowStuckError(
            f"workflow run {run_id} ({state.workflow}) never waited for signal {signal!r}: "
            f"{detail}",
            run_id,
        )

    def wait(self, run: RunHandle | str) -> JSON:
        """Run until ``run`` settles and return its output (``handle.wait()`` does the same).

        Raises ``WorkflowFailedError``/``WorkflowCancelledError`` as
        ``wait`` does, and :class:`WorkflowStuckError` when it cannot settle.
        """
        handle = run if isinstance(run, RunHandle) else self.engine.handle(run)
        self.settle(handle.run_id)
        return handle.result()

    def settle(self, run_id: str) -> None:
        """Run until ``run_id`` settles; :class:`WorkflowStuckError` if it cannot."""
        self._drive(lambda: self._settled(run_id), math.inf, None, f"waiting for run {run_id}")
        if not self._settled(run_id):
            raise WorkflowStuckError(self.explain(run_id), run_id)

    def sweep(self) -> SweepReport:
        """One sweep now, as beat would run it (re-sends lost messages, wakes due timers)."""
        return self.engine.sweep()

    def _drive(
        self,
        condition: Callable[[], bool] | None,
        until: float,
        max_messages: int | None,
        what: str,
    ) -> int:
        """Deliver messages due by ``until`` (epoch s), in order, until ``condition()``."""
        if not self.active:
            raise RuntimeError(
                "the test environment is not active: drive it inside `with workflow_test_env(...)`"
            )
        limit = self.max_messages if max_messages is None else max_messages
        delivered = 0
        while condition is None or not condition():
            head = self.dispatcher.peek()
            if head is None:
                # Nothing queued (a dropped message, a wake-up beyond any queue's
                # horizon): a timer the store knows of is still due, as beat finds it.
                wake = self._next_stored_wake()
                if wake is None or wake / 1000 > until:
                    break
                self._check_limit(delivered, limit, what)
                self.clock.advance_to_ms(wake)
                delivered += 1
                if not self.sweep().total and self.dispatcher.peek() is None:
                    break
                continue
            if head.due > until:
                break
            self._check_limit(delivered, limit, what)
            self.dispatcher.deliver_next(until)
            delivered += 1
        return delivered

    def _check_limit(self, delivered: int, limit: int, what: str) -> None:
        if delivered < limit:
            return
        queued = sorted(self.dispatcher.messages)
        shown = ", ".join(_describe(m) for m in queued[:5]) or "none"
        raise WorkflowStuckError(
            f"{what}: gave up after delivering {limit} messages, with {len(queued)} still "
            f"queued (next: {shown}) and the clock {self.elapsed:.3f} s on: a workflow "
            "that never ends (a retry or timer loop?); pass max_messages= to allow more"
        )

    def _next_stored_wake(self) -> int | None:
        wakes = [
            run.wake_at
            for run in self.store.list_runs(status=RunStatus.RUNNING, limit=1_000_000)
            if run.wake_at is not None
        ]
        return min(wakes) if wakes else None

    # --- tasks ---------------------------------------------------------------
    @overload
    def task(
        self, fn: Callable[P, R], *, name: str | None = None, queue: str | None = None
    ) -> Callable[P, R]: ...

    @overload
    def task(
        self, fn: None = None, *, name: str | None = None, queue: str | None = None
    ) -> TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
    ) -> Callable[..., Any] | TaskDecorator:
        """Register a plain function as a task in this environment: ``@env.task``,
        ``@env.task(name=..., queue=...)`` or ``env.task(fn)``; the function is
        returned as it is.

        It stands in for one of your Celery tasks when named like it: by
        ``name=``, or bare when its function name is that of exactly one task
        of your app (``def charge_card`` for ``@app.task(name="shop.charge")
        def charge_card``). Else it is a task of its own, named after the
        function.
        """

        def register(f: Callable[P, R]) -> Callable[P, R]:
            self.dispatcher.task(f, name=name or self._stands_in_for(f), queue=queue)
            return f

        return register(fn) if fn is not None else register

    def _stands_in_for(self, fn: Callable[..., Any]) -> str | None:
        """The name of the app's one task whose function is named like ``fn``
        (None: none, or ``fn``'s own name is a task's name already)."""
        own = getattr(fn, "__name__", None)
        app = self.app
        if app is None or not isinstance(own, str) or own in app.tasks:
            return None
        same = sorted(
            task_name
            for task_name, task in list(app.tasks.items())
            if not task_name.startswith(("celery.", "pikku.", "pikku_"))
            and getattr(getattr(task, "run", None), "__name__", None) == own
        )
        if len(same) > 1:
            raise ValueError(
                f"env.task: {own!r} is the function of several tasks of Celery app "
                f"{app.main!r} ({', '.join(same)}): say which one it stands in for with "
                f"@env.task(name=...)"
            )
        return same[0] if same else None

    # --- looking ---------------------------------------------------------------
    @property
    def queued(self) -> list[Message]:
        """The messages waiting in the queue, in the order they will be delivered."""
        return sorted(self.dispatcher.messages)

    @property
    def sent(self) -> list[Message]:
        """Every message pikku sent in this environment (steps and wake-ups), in order."""
        return list(self.dispatcher.sent)

    def runs(self, status: RunStatus | None = None) -> list[RunState]:
        """The runs of this environment, newest first (``status`` filters)."""
        return self.store.list_runs(status=status, limit=1_000_000)

    def waiting_for(self, run: RunHandle | str) -> list[str]:
        """The signals ``run`` is waiting for now (none once it settled)."""
        run_id = _run_id(run)
        state = self.store.get_run(run_id)
        if state is None or state.status.terminal:
            return []
        return [
            step.name[len(SIGNAL_PREFIX) :]
            for step in self.store.get_steps(run_id)
            if step.kind == StepKind.SIGNAL and _open(step)
        ]

    def explain(self, run_id: str) -> str:
        """Why ``run_id`` is not settled, as far as the store and the queue tell."""
        run = self._run(run_id)
        if run.status.terminal:
            return f"workflow run {run_id} ({run.workflow}) is {run.status}"
        reasons = self._blockers(run, set())
        if any(m.run_id == run_id for m in self.dispatcher.messages):
            reasons.insert(0, "it still has messages queued (delivered by the next drive)")
        head = (
            f"workflow run {run_id} ({run.workflow}) cannot settle: it is {run.status}, "
            "nothing more is queued for it and no timer of it is due"
        )
        return head + "; " + "; ".join(reasons or ["no step of it is open"])

    def _blockers(self, run: RunState, seen: set[str]) -> list[str]:
        seen.add(run.id)
        reasons: list[str] = []
        blocked = getattr(run, "blocked", None)
        if blocked:
            reasons.append(f"no pass can run: {blocked}")
        queued = {m.step_id for m in self.dispatcher.messages if m.kind == "step"}
        for step in self.store.get_steps(run.id):
            if not _open(step):
                continue
            if step.kind == StepKind.SIGNAL:
                name = step.name[len(SIGNAL_PREFIX) :]
                timeout = " (no timeout)" if step.wake_at is None else ""
                reasons.append(
                    f"it waits for signal {name!r}{timeout}, which nobody sent: send it, before "
                    f"or during the wait, with pikku.send_signal({run.id!r}, {name!r}, payload)"
                )
            elif step.kind == StepKind.CHILD and step.child_run_id:
                child = self.store.get_run(step.child_run_id)
                if child is None or child.id in seen:
                    continue
                if child.status.terminal:
                    reasons.append(
                        f"its child step {step.name!r} is open though child run {child.id} "
                        f"ended {child.status} (a lost wake-up: env.sweep() repairs it)"
                    )
                    continue
                inner = "; ".join(self._blockers(child, seen)) or "no step of it is open"
                reasons.append(
                    f"its step {step.name!r} waits for child run {child.id} ({child.workflow}), "
                    f"where {inner}"
                )
            elif step.kind == StepKind.TASK and step.id not in queued:
                reasons.append(_task_blocker(step))
            elif step.kind == StepKind.SLEEP:
                reasons.append(f"its timer {step.name!r} has no wake-up queued")
        return reasons

    def _run(self, run_id: str) -> RunState:
        run = self.store.get_run(run_id)
        if run is None:
            raise LookupError(f"no workflow run {run_id!r} in this test environment")
        return run

    def _settled(self, run_id: str) -> bool:
        return self._run(run_id).status.terminal


def _task_blocker(step: StepState) -> str:
    what = f"its step {step.name!r} (task {step.task_name})"
    if step.status == StepStatus.RUNNING:
        return (
            f"{what} is running attempt {step.attempt} with no worker: its lease must "
            "lapse (env.advance(...)) and the sweep (env.sweep()) take it over"
        )
    if step.status == StepStatus.FAILED:
        return f"{what} waits for its next attempt, but no message for it is queued"
    return (
        f"{what} is {step.status} but no message for it is queued (dropped?): env.sweep() "
        "sends it again, as beat would, once the engine's message_grace has passed"
    )


def _open(step: StepState) -> bool:
    return not step.settled and step.status != StepStatus.SUCCEEDED


def _describe(msg: Message) -> str:
    if msg.kind == "step":
        return f"step {msg.task_name} of run {msg.run_id[:8]}"
    return f"wake-up ({msg.reason or 'run'}) of run {msg.run_id[:8]}"


def _run_id(run: RunHandle | str) -> str:
    return run.run_id if isinstance(run, RunHandle) else str(run)


_MISSING = object()


def workflow_test_env(
    engine: WorkflowEngine,
    *,
    start: datetime | float | None = None,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    lease: float = 30.0,
) -> WorkflowTestEnv:
    """A :class:`WorkflowTestEnv` on your Pikku (or engine), to use as a context
    manager: ``with workflow_test_env(pikku) as env: ...``.

    For the ``with``'s duration your engine runs on in-memory adapters and a
    virtual clock that skips ahead to the next due message whenever nothing is
    due now; the real store, leases and dispatcher are back afterwards.
    """
    return WorkflowTestEnv(engine, start=start, max_messages=max_messages, lease=lease)
