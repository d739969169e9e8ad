"""``WorkflowEngine``: the workflow registry bound to its three ports."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from ..errors import (
    StoreUnavailableError,
)
from ..model.values import (
    JSON,
    Delivery,
    Operator,
    RunState,
)
from ..names import check_id, check_name
from ..payload import dumps
from ..ports.lease import LeaseService, positive_seconds
from ..ports.store import StoreCapabilities, WorkflowStore
from ..store.rules import LEASE_BOUND_FACTOR
from .closing import close_each
from .concurrency import Concurrency
from .deadline import run_timeout_ms
from .dispatcher import Dispatcher, EagerDispatch
from .eager import EAGER_MAX_SECONDS, EAGER_MAX_STEPS, EagerBudget
from .execute import StepBody, execute_step
from .handle import RunHandle
from .keeper import StepLeaseKeeper
from .known_runs import KnownRuns
from .limits import Limits
from .observe import Carrier, Observers
from .orchestrate import orchestrate
from .run_ids import parse_run_id
from .starting import start_run
from .steering import cancel_run, retry_run, send_signal
from .sweep import SWEEP_MAX_PAGES, SweepReport, sweep
from .workflow import Workflow, WorkflowDecorator, WorkflowFunction, WorkflowRegistry

if TYPE_CHECKING:
    from datetime import timedelta

    from ..schedule import Overlap, Schedule, ScheduleReport, ScheduleStore
    from .context import Context

log = logging.getLogger(__name__)

_In = TypeVar("_In")
_Out = TypeVar("_Out")


def _check_settings(
    eager_max_steps: int,
    eager_max_seconds: float,
    outage_timeout: float,
    sweep_backoff: float,
    sweep_max_backoff: float,
) -> None:
    """Refuse the engine's settings that make no sense, naming them, before
    anything is built on them."""
    if eager_max_steps < 0 or not eager_max_seconds >= 0:
        raise ValueError(
            f"eager_max_steps ({eager_max_steps!r}) and eager_max_seconds "
            f"({eager_max_seconds!r}) must be >= 0"
        )
    if not outage_timeout >= 0:
        raise ValueError(f"outage_timeout must be 0 or more, not {outage_timeout!r}")
    if not sweep_max_backoff >= sweep_backoff:
        raise ValueError(
            f"sweep_max_backoff ({sweep_max_backoff!r}) must be >= sweep_backoff "
            f"({sweep_backoff!r})"
        )


class WorkflowEngine:
    """Pure workflow logic over a store, a lease service and a dispatcher.

    Knows nothing of Celery or SQL; :class:`pikku_celery.Pikku` builds one
    from a Celery app.
    """

    retention: timedelta | None = None
    """How long settled runs are kept (None: for good); ``Pikku(retention=...)`` sets it."""

    def __init__(
        self,
        store: WorkflowStore,
        leases: LeaseService,
        dispatcher: Dispatcher,
        *,
        worker_id: str | None = None,
        orchestration_queue: str | None = None,
        run_lease_ttl: float = 30.0,
        sweep_lease_ttl: float = 60.0,
        sweep_backoff: float = 5.0,
        message_grace: float = 30.0,
        idle_after: float = 60.0,
        max_input_bytes: int = 1_000_000,
        outcome_retry: float = 60.0,
        outage_timeout: float = 10.0,
        sweep_max_backoff: float = 300.0,
        max_steps_per_run: int = Limits.max_steps_per_run,
        max_children_per_run: int = Limits.max_children_per_run,
        max_child_depth: int = Limits.max_child_depth,
        pass_max_seconds: float = Limits.pass_max_seconds,
        pass_max_calls: int = Limits.pass_max_calls,
        max_payload_depth: int = Limits.max_payload_depth,
        max_result_bytes: int = Limits.max_result_bytes,
        resume_max_bodies: int = Limits.resume_max_bodies,
        resume_max_steps: int = Limits.resume_max_steps,
        eager_steps: bool = True,
        eager_max_steps: int = EAGER_MAX_STEPS,
        eager_max_seconds: float = EAGER_MAX_SECONDS,
        max_lease: float | None = None,
    ) -> None:
        _check_settings(
            eager_max_steps, eager_max_seconds, outage_timeout, sweep_backoff, sweep_max_backoff
        )
        self.eager_steps = eager_steps
        """Whether a worker runs a run's next step itself when it can (eager steps)."""
        self.eager_max_steps = eager_max_steps
        self.eager_max_seconds = eager_max_seconds
        self.store = store
        self._capabilities = StoreCapabilities(store)
        self.observers = Observers()
        """Who is told what happens (metrics, traces): ``observers.add(observer)``."""
        self.leases = leases
        self.dispatcher = dispatcher
        self._eager_dispatch = dispatcher if isinstance(dispatcher, EagerDispatch) else None
        self.registry = WorkflowRegistry()
        self.keeper = StepLeaseKeeper(store)
        self.known_runs = KnownRuns()  # what passes left, for the claims that follow
        self._worker_id = worker_id
        self.orchestration_queue = orchestration_queue
        self.run_lease_ttl = run_lease_ttl
        self.sweep_lease_ttl = sweep_lease_ttl
        self.sweep_backoff = sweep_backoff
        self.message_grace = message_grace
        self.idle_after = idle_after
        self.max_input_bytes = max_input_bytes
        self.outcome_retry = outcome_retry
        self.outage_timeout = outage_timeout
        """How long a call from outside a worker (start, signal, cancel, a read)
        waits out a store outage before raising :class:`StoreUnavailableError`."""
        self.sweep_max_backoff = sweep_max_backoff
        self.limits = Limits(
            max_steps_per_run=max_steps_per_run,
            max_children_per_run=max_children_per_run,
            max_child_depth=max_child_depth,
            pass_max_seconds=pass_max_seconds,
            pass_max_calls=pass_max_calls,
            max_payload_depth=max_payload_depth,
            max_result_bytes=max_result_bytes,
            resume_max_bodies=resume_max_bodies,
            resume_max_steps=resume_max_steps,
        )
        self.max_lease = None if max_lease is None else positive_seconds(max_lease, "max_lease")
        """The longest lease any worker of the fleet grants, in seconds (None: see
        :meth:`lease_bound_ms`)."""
        self.schedules: dict[str, Schedule] = {}
        """Every schedule defined (``@pikku.schedule``), by name."""
        self._found_later()

    def _found_later(self) -> None:
        """What the engine finds or builds on first use, empty until then."""
        self._own_id: tuple[int, str] = (0, "")
        self._result_limit: tuple[int, str] | None = None
        self._warned_queues: set[str | None] = set()
        self._warn_lock = threading.Lock()
        self._lease_bound: int | None = None
        self._schedule_store: ScheduleStore | None = None

    def lease_bound_ms(self) -> int:
        """How far ahead of the store's clock any lease of the fleet may end (ms).

        A running step whose lease ends further ahead was never granted it (an
        edited row, a store clock set back) and counts as lapsed. The bound is
        the fleet's, never this process's own lease: in a rolling deploy other
        workers may hold longer leases, and those are live until they end.
        ``max_lease`` when set, else twice the longest lease the dispatcher
        knows (:class:`~pikku_celery.Pikku` uses its queues' horizons).
        """
        if self._lease_bound is None:
            self._lease_bound = self._resolve_lease_bound_ms()
        return self._lease_bound

    def _resolve_lease_bound_ms(self) -> int:
        if self.max_lease is not None:
            return round(self.max_lease * 1000)
        return LEASE_BOUND_FACTOR * self.dispatcher.longest_lease_ms()

    def eager_budget(self, lease_ms: int) -> EagerBudget | None:
        """The eager budget of a step message received now from a queue whose
        lease is ``lease_ms`` (None: eager steps off). It ends within half
        the lease: the message stays unacknowledged until the call returns,
        and its queue's redelivery horizon is that lease."""
        if not self.eager_steps or self.eager_max_steps == 0:
            return None
        seconds = min(self.eager_max_seconds, lease_ms / 2000)
        return EagerBudget.for_message(self.eager_max_steps, seconds)

    @property
    def eager_dispatch(self) -> EagerDispatch | None:
        """The dispatcher if it can run steps here (eager steps)."""
        return self._eager_dispatch

    @property
    def capabilities(self) -> StoreCapabilities:
        """What the store can do beyond the port (transactional steps, settle
        notices), found once per store (a test may swap the store in)."""
        found = self._capabilities
        if found.store is not self.store:
            found = self._capabilities = StoreCapabilities(self.store)
        return found

    @property
    def worker_id(self) -> str:
        """Who holds a lease: host and process (recomputed after fork)."""
        if self._worker_id:
            return self._worker_id
        pid = os.getpid()
        if self._own_id[0] != pid:  # first use, or a forked child's
            self._own_id = (pid, f"{socket.gethostname()}:{pid}")
        return self._own_id[1]

    # --- defining ------------------------------------------------------------
    @overload
    def workflow(
        self,
        fn: Callable[[Context, _In], _Out],
        *,
        name: str | None = None,
        eager_steps: bool = True,
        version: str | int | None = None,
        concurrency: Concurrency | None = None,
        timeout: float | timedelta | None = None,
    ) -> Workflow[_In, _Out]: ...

    @overload
    def workflow(
        self,
        fn: Callable[[Context], _Out],
        *,
        name: str | None = None,
        eager_steps: bool = True,
        version: str | int | None = None,
        concurrency: Concurrency | None = None,
        timeout: float | timedelta | None = None,
    ) -> Workflow[None, _Out]: ...

    @overload
    def workflow(
        self,
        fn: None = None,
        *,
        name: str | None = None,
        eager_steps: bool = True,
        version: str | int | None = None,
        concurrency: Concurrency | None = None,
        timeout: float | timedelta | None = None,
    ) -> WorkflowDecorator: ...

    def workflow(
        self,
        fn: WorkflowFunction | None = None,
        *,
        name: str | None = None,
        eager_steps: bool = True,
        version: str | int | None = None,
        concurrency: Concurrency | None = None,
        timeout: float | timedelta | None = None,
    ) -> Workflow[Any, Any] | WorkflowDecorator:
        """Register a workflow body ``fn(ctx, input)``; usable bare or with ``name=``.

        Typed from ``fn``: ``fn(ctx, input: In) -> Out`` gives a
        ``Workflow[In, Out]``, ``fn(ctx) -> Out`` a ``Workflow[None, Out]``.
        ``eager_steps=False`` sends each of its steps through the broker.
        ``version=`` registers one of several bodies under one name: each run
        replays on the version it started on, new runs start on the newest.
        ``concurrency=`` bounds how many of its runs run at once per key
        (:class:`~pikku_celery.Concurrency`).
        ``timeout=`` gives each run a deadline that long after it starts (see
        :meth:`start`).
        """
        timeout_ms = None if timeout is None else run_timeout_ms(timeout)

        def register(f: WorkflowFunction) -> Workflow[Any, Any]:
            wf = Workflow(
                self,
                f,
                name or f"{f.__module__}.{f.__qualname__}",
                version,
                eager_steps=eager_steps,
                concurrency=concurrency,
                timeout_ms=timeout_ms,
            )
            self.registry.add(wf)
            return wf

        return register(fn) if fn is not None else register

    # --- schedules -----------------------------------------------------------
    @overload
    def schedule(
        self,
        workflow: Workflow[Any, Any] | str,
        *,
        every: float | timedelta | None = None,
        cron: str | None = None,
        input: JSON = None,
        overlap: Overlap | str = "skip",
        catch_up: int = 0,
        name: str | None = None,
    ) -> Schedule: ...

    @overload
    def schedule(
        self,
        workflow: None = None,
        *,
        every: float | timedelta | None = None,
        cron: str | None = None,
        input: JSON = None,
        overlap: Overlap | str = "skip",
        catch_up: int = 0,
        name: str | None = None,
    ) -> Callable[[Workflow[_In, _Out]], Workflow[_In, _Out]]: ...

    def schedule(
        self,
        workflow: Workflow[Any, Any] | str | None = None,
        *,
        every: float | timedelta | None = None,
        cron: str | None = None,
        input: JSON = None,
        overlap: Overlap | str = "skip",
        catch_up: int = 0,
        name: str | None = None,
    ) -> Schedule | Callable[[Workflow[_In, _Out]], Workflow[_In, _Out]]:
        """Start ``workflow`` on every tick of ``every=`` (seconds or a
        timedelta) or ``cron=`` (UTC), with ``input``, once per tick.

        Stacked on a workflow (``@pikku.schedule(every=300)`` above
        ``@pikku.workflow``) it returns the workflow; given one (or its name)
        it returns the :class:`~pikku_celery.schedule.Schedule`. ``overlap``:
        ``"skip"`` a tick while the previous tick's run has not ended,
        ``"allow"`` it, or ``"cancel_previous"``. ``catch_up``: how many ticks
        missed while no beat ran are started too. ``name`` (default: the
        workflow's) names the schedule and its runs' idempotency keys. See the
        "Schedules" guide.
        """
        from ..schedule.define import define_schedule

        def define(target: Workflow[Any, Any] | str) -> Schedule:
            made = define_schedule(
                self,
                target,
                every=every,
                cron=cron,
                input=input,
                overlap=overlap,
                catch_up=catch_up,
                name=name,
            )
            self._schedule_defined(made)
            return made

        if workflow is not None:
            return define(workflow)

        def stacked(wf: Workflow[_In, _Out]) -> Workflow[_In, _Out]:
            define(wf)
            return wf

        return stacked

    def _schedule_defined(self, schedule: Schedule) -> None:
        """Called once per schedule defined (Pikku installs its beat entry)."""

    @property
    def schedule_store(self) -> ScheduleStore:
        """Where schedules' progress is kept (memory here, on the store's clock)."""
        if self._schedule_store is None:
            from ..schedule.store import InMemoryScheduleStore

            self._schedule_store = InMemoryScheduleStore(self.store.now_ms)
        return self._schedule_store

    @schedule_store.setter
    def schedule_store(self, store: ScheduleStore) -> None:
        self._schedule_store = store

    def run_schedules(self, grace: float = 0.0) -> ScheduleReport:
        """One pass over the schedules now: what the beat entry runs (see
        :mod:`pikku_celery.schedule.tick`); safe to run from several beats.
        Ticks within ``grace`` seconds of now are late, not missed: they
        start whatever ``catch_up`` says."""
        from ..schedule.tick import run_schedules

        schedules = list(self.schedules.values())
        return run_schedules(self, schedules, self.schedule_store, round(grace * 1000))

    # --- starting and steering -----------------------------------------------
    @overload
    def start(
        self,
        workflow: Workflow[_In, _Out],
        input: _In,
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[_Out]: ...

    @overload
    def start(
        self,
        workflow: Workflow[None, _Out],
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[_Out]: ...

    @overload
    def start(
        self,
        workflow: str,
        input: JSON = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[Any]: ...

    def start(
        self,
        workflow: str | Workflow[Any, Any],
        input: JSON = None,
        *,
        idempotency_key: str | None = None,
        timeout: float | timedelta | None = None,
    ) -> RunHandle[Any]:
        """Record a new run and take its first pass right here.

        Given a :class:`Workflow`, ``input`` is checked against its input type
        and the handle is typed with its output; given a name, neither is known.

        Input that is not JSON (or too large) is refused before anything is
        written, naming the offending value's path. An ``idempotency_key``
        already used returns that run if the input is the same, and raises
        :class:`IdempotencyKeyReusedError` (naming the run) if it is not.

        ``timeout`` (else the workflow's own ``timeout=``) sets the run's
        deadline that long after it is created, on the database's clock:
        once it passes, the run fails with :class:`WorkflowDeadlineError`,
        its open steps are closed and its children asked to stop.
        """
        return start_run(self, workflow, input, idempotency_key, timeout)

    def check_input(self, value: JSON, where: str, path: str) -> str:
        """``value`` as stored JSON, refused (naming the limit) if it is not
        JSON, larger than ``max_input_bytes`` or nested deeper than
        ``max_payload_depth``: what anyone outside a run may hand it."""
        return dumps(value, where, path, self.max_input_bytes, self.limits.max_payload_depth)

    def result_limit(self) -> tuple[int, str]:
        """The largest step result this engine's store takes, and the setting
        that sets it: ``max_result_bytes``, or the store's own ceiling when lower."""
        if self._result_limit is None:
            limit = (self.limits.max_result_bytes, "max_result_bytes")
            values = self._capabilities.values
            try:
                ceiling = values.max_value_bytes() if values is not None else None
            except Exception as exc:  # the store is away: ask again next time
                log.warning("could not read the store's largest value: %s", exc)
                return limit
            if ceiling is not None and ceiling[0] < limit[0]:
                limit = ceiling
            self._result_limit = limit
        return self._result_limit

    def handle(self, run_id: str) -> RunHandle[Any]:
        """A :class:`RunHandle` for a run id (checked to be a run id, not looked up)."""
        return RunHandle(self, parse_run_id(run_id))

    def send_signal(
        self, run_id: str, name: str, payload: JSON = None, *, by: Operator | None = None
    ) -> RunState:
        """Deliver a signal; the run's next pass sees it. A settled run refuses
        it; a name already sent with another payload raises
        :class:`SignalAlreadySentError` (the same payload again is a no-op).

        Kept in the run's audit trail as done ``by`` (default: ``"api"``).
        """
        return send_signal(self, run_id, name, payload, by)

    def cancel(self, run_id: str, *, by: Operator | None = None) -> RunState:
        """Ask a run to end as cancelled (its children too). A settled run refuses.

        Kept in the run's audit trail as done ``by`` (default: ``"api"``).
        """
        return cancel_run(self, run_id, by)

    def retry(self, run_id: str, *, by: Operator | None = None) -> RunState:
        """Resume a failed run from its failed steps, with fresh attempts.

        The run's error is cleared for the new attempts, so the audit entry
        (done ``by``, default ``"api"``) keeps it, with the failed steps'
        names; their failed attempts stay in the steps' history.
        """
        return retry_run(self, run_id, by)

    # --- what workers do -----------------------------------------------------
    def orchestrate(self, run_id: str, reason: str = "", *, trace: Carrier | None = None) -> None:
        """One orchestration pass of the run (what ``pikku.orchestrate`` messages run).

        ``trace`` is the trace context the message carried (see ``observe.run_trace``).
        Raises :class:`InvalidIdError` for a run id that is not a UUID, before any SQL.
        """
        orchestrate(self, check_id(run_id, "run id"), reason, trace)

    def execute_step(
        self,
        run_id: str,
        step_id: str,
        task_name: str,
        body: StepBody,
        queue: str | None = None,
        *,
        trace: Carrier | None = None,
        delivery: Delivery | None = None,
    ) -> Any:
        """Run one attempt of a step if this message wins the claim (see ``execute``).

        Ids are checked to be UUIDs (:class:`InvalidIdError`) and the task and
        queue to be names, before any SQL: a message is anyone's input.
        ``trace`` is the trace context the message carried; ``delivery`` its
        Celery task id and the worker's node name, kept on each attempt it
        runs (no node: this process's ``host:pid``).
        """
        run_id = check_id(run_id, "run id")
        step_id = check_id(step_id, "step id")
        check_name(task_name, "task name")
        if queue is not None:
            check_name(queue, "queue")
        return execute_step(self, run_id, step_id, task_name, body, queue, trace, delivery)

    # --- letting go ----------------------------------------------------------
    def close(self) -> None:
        """Close what the engine's store, leases and dispatcher hold open
        (connection pools, the settle listener and its LISTEN connection,
        lease clients' connections). Idempotent. The engine stays usable:
        what it needs again afterwards it opens again on demand."""
        close_each((self.store, self.leases, self.dispatcher))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is passing: the store unreachable, or an error the
        store calls passing (a lost connection, a restart)."""
        if isinstance(exc, StoreUnavailableError):
            return True
        check = self.capabilities.transient
        return check is not None and check.is_transient(exc)

    def sweep(self, limit: int = 200, max_pages: int = SWEEP_MAX_PAGES) -> SweepReport:
        """One sweep now: what beat runs every ``sweep_interval`` seconds
        (``limit`` steps a read, at most ``max_pages`` reads of each kind)."""
        return sweep(self, limit, max_pages)

    def warn_short_lease(self, queue: str | None, lease_ms: int) -> None:
        """Log once per queue that its step lease is under 2 s (renewals add up)."""
        with self._warn_lock:
            if queue in self._warned_queues:
                return
            self._warned_queues.add(queue)
        log.warning(
            "queue %r gives steps a lease of %d ms (under 2 s): it is renewed at half its "
            "length anyway, but raise the queue's visibility timeout "
            "(broker_transport_options['visibility_timeout'] or pikku's queue_leases)",
            queue,
            lease_ms,
        )
