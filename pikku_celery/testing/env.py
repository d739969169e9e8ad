"""A time-skipping test environment for your own workflows (after Temporal's).

``workflow_test_env(pikku)`` takes *your* :class:`~pikku_celery.Pikku` (or
any :class:`~pikku_celery.engine.WorkflowEngine`) and builds an engine of
its own over your Pikku's workflows and options, on in-memory adapters and a
:class:`VirtualClock` (:mod:`.own_engine`). For the duration of a ``with``
your Pikku's entry points reach that engine, while its own store, leases and
dispatcher stay as they are: your own code runs unchanged
(``fulfil_order.start(...)``, ``pikku.send_signal(...)`` and
``RunHandle.wait()`` reach the test environment), every workflow registered
on that Pikku is there, and no broker message is sent and no database touched.

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

import math
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, ParamSpec, Protocol, TypeVar, overload

from celery import Celery
from celery.result import AsyncResult

from ..celery.integration import Pikku
from ..engine.core import WorkflowEngine
from ..engine.handle import RunHandle
from ..engine.sweep import SweepReport
from ..errors import WorkflowTimeoutError
from ..lease.memory import InMemoryLeaseService
from ..model.values import JSON, RunState, RunStatus
from .adapters import HOSTNAME, InlineLeaseKeeper, WorkflowTestDispatcher, WorkflowTestStore
from .clock import VirtualClock
from .explain import describe, signals_awaited, why_unsettled
from .inline import InlineDispatcher, Message
from .own_engine import Forwarding, engine_like

__all__ = [
    "HOSTNAME",
    "SentTask",
    "TaskDecorator",
    "VirtualClock",
    "WorkflowStuckError",
    "WorkflowTestDispatcher",
    "WorkflowTestEnv",
    "WorkflowTestStore",
    "workflow_test_env",
]

P = ParamSpec("P")
R = TypeVar("R")


class TaskDecorator(Protocol):
    """What ``env.task(name=...)`` returns: a decorator keeping the function's type."""

    def __call__(self, fn: Callable[P, R], /) -> Callable[P, R]: ...


DEFAULT_MAX_MESSAGES = 10_000


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
_MISSING = object()


class WorkflowTestEnv:
    """Your workflows on an engine of the environment's own, in-memory and on a
    virtual clock; your engine's entry points reach it while inside ``with``.

    ``engine`` is your :class:`~pikku_celery.Pikku` or any
    :class:`~pikku_celery.engine.WorkflowEngine`; its workflows, options and
    Celery app are used as they are, and its own adapters are never touched.
    ``start`` sets the clock's start (an aware datetime or epoch seconds;
    default: now). ``max_messages`` bounds every driving call (a workflow
    that never ends raises :class:`WorkflowStuckError` instead of looping).
    ``lease`` is the step lease in seconds (the clock stands still while a
    step runs, so it never lapses on its own).

    The store, leases, dispatcher and :attr:`engine` exist from construction,
    so a run's history stays readable (``env.store``) after the ``with``.
    Drive it from one thread (the test's): while it is active, your engine's
    ``start``, ``send_signal``... reach the environment from every thread of
    the process.
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
        self._user_engine = engine
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
        self.keeper = InlineLeaseKeeper(self.store)
        self.engine = engine_like(engine, self.store, self.leases, self.dispatcher, self.keeper)
        """The environment's own engine: your workflows and options on its adapters."""
        self.dispatcher.engine = self.engine
        self.sent_tasks: list[SentTask] = []
        self._started_ms = self.clock.now_ms()
        self._forwarding: Forwarding | None = None
        self._saved_send: Any = None

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return f"<WorkflowTestEnv {state} on {self._user_engine!r} at {self.now.isoformat()}>"

    # --- entering and leaving ------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether your engine's entry points reach this environment now."""
        return self._forwarding is not None

    def __enter__(self) -> WorkflowTestEnv:
        engine = self._user_engine
        with _active_lock:
            other = _active.get(id(engine))
            if other is not None:
                raise RuntimeError(
                    f"{engine!r} is already inside a workflow_test_env ({other!r}); "
                    "environments on one engine do not nest"
                )
            _active[id(engine)] = self
        self._forwarding = Forwarding(engine, self.engine).__enter__()
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
        """Give your engine its own entry points back (idempotent)."""
        forwarding, self._forwarding = self._forwarding, None
        if forwarding is None:
            return
        engine = self._user_engine
        forwarding.__exit__(None, None, None)
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
        shown = ", ".join(describe(m) for m in queued[:5]) or "none"
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
        return signals_awaited(self.store, _run_id(run))

    def explain(self, run_id: str) -> str:
        """Why ``run_id`` is not settled, as far as the store and the queue tell."""
        return why_unsettled(self.store, self.dispatcher.messages, self._run(run_id))

    def _run(self, run_id: str) -> RunState:
        run = self.store.get_run(run_id)
        if run is None:
            raise LookupError(f"no workflow run {run_id!r} in this test environment")
        return run

    def _settled(self, run_id: str) -> bool:
        return self._run(run_id).status.terminal


def _run_id(run: RunHandle | str) -> str:
    return run.run_id if isinstance(run, RunHandle) else str(run)


def workflow_test_env(
    engine: WorkflowEngine,
    *,
    start: datetime | float | None = None,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    lease: float = 30.0,
) -> WorkflowTestEnv:
    """A :class:`WorkflowTestEnv` on your Pikku (or engine), to use as a context
    manager: ``with workflow_test_env(pikku) as env: ...``.

    For the ``with``'s duration your engine's entry points reach the
    environment's own engine: your workflows on in-memory adapters and a
    virtual clock that skips ahead to the next due message whenever nothing is
    due now. Your engine's own store, leases and dispatcher are never touched.
    """
    return WorkflowTestEnv(engine, start=start, max_messages=max_messages, lease=lease)
