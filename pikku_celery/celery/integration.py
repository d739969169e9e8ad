"""``Pikku(app, ...)``: durable workflows on an existing Celery app.

Registers three tasks (``pikku.orchestrate``, ``pikku.run_step``,
``pikku.sweep``), installs the sweep into ``beat_schedule``, resolves each
queue's lease from the broker's redelivery horizon, and rebuilds database
connections in every worker process after fork.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from celery import Celery, signals

from ..engine.core import WorkflowEngine
from ..engine.handle import RunHandle
from ..engine.outage import ride_out
from ..engine.prune import TICK_SECONDS, PruneReport, prune
from ..engine.resume import release_all
from ..engine.sweep import SWEEP_MAX_PAGES, SweepReport
from ..errors import (
    InvalidIdError,
    PayloadError,
    PikkuError,
    WorkflowStepFunctionMismatchError,
)
from ..names import check_id
from ..ports.lease import LeaseService, positive_seconds
from ..ports.store import WorkflowStore
from ..schedule.model import Schedule
from ..schedule.tick import ScheduleReport
from ..sql.engines import make_engine
from ..sql.pooler import Pooler, check_pooler, use_pooler
from ..store.rules import LEASE_BOUND_FACTOR
from .broker_check import broker_check_on_worker_start
from .dispatcher import (
    ORCHESTRATE,
    RUN_STEP,
    SCHEDULES,
    SWEEP,
    CeleryDispatcher,
    rate_limited_run_step,
)
from .extensions import durable_canvas, registered
from .loading import import_task_modules
from .messages import (
    InvalidMessageError,
    message_delivery,
    message_trace,
    orchestrate_message,
    step_message,
)
from .outage import redeliver_later
from .queues import DEFAULT_STEP_LEASE, QueueLease, QueueLeases
from .retention import checked_retention, install_retention
from .step_body import CeleryStepBody

log = logging.getLogger(__name__)

BEAT_ENTRY = "pikku-sweep"
DEFAULT_SWEEP_INTERVAL = 15.0
"""Seconds between sweeps: with the default step lease (60 s) a dead worker's
step is taken over within 75 s. A sweep is a few indexed reads, cheap to run."""

SCHEDULES_BEAT_ENTRY = "pikku-schedules"
DEFAULT_SCHEDULE_INTERVAL = 5.0
"""Seconds between passes over the schedules: a tick's run starts within this
of its time. Installed into beat once a schedule is defined."""


def _default_ports(
    sql_engine: sa.Engine | None,
    store: WorkflowStore | None,
    lease_service: LeaseService | None,
    upgrade_command: str | None,
    durable_claims: bool,
    pooler: Pooler | None,
) -> tuple[WorkflowStore, LeaseService]:
    """The store and lease service given, or the SQL ones on ``sql_engine``
    (leases in memory when there is no database)."""
    if store is None:
        from ..store.sql_for import store_for

        assert sql_engine is not None
        store = store_for(
            sql_engine,
            upgrade_command=upgrade_command,
            durable_claims=durable_claims,
            pooler=pooler,
        )
    if lease_service is None:
        if sql_engine is not None:
            from ..lease.sql import SQLLeaseService

            lease_service = SQLLeaseService(sql_engine)
        else:
            from ..lease.memory import InMemoryLeaseService

            lease_service = InMemoryLeaseService()
    return store, lease_service


class Pikku(WorkflowEngine):
    """The workflow engine bound to a Celery app and a SQL database.

    ``database_url`` (or a ready SQLAlchemy ``engine``) holds runs, steps and,
    unless ``lease_service`` is given (e.g. Redis), the leases too. Building
    one connects to nothing: the store checks its tables on first use, and
    ``upgrade_command`` is the command its error then names (Django's
    integration names ``manage.py pikku_celery db upgrade``).

    A step's lease on a queue is ``min(horizon, step_lease)``: the queue's
    redelivery horizon (visibility timeout, consumer timeout, or
    ``queue_leases[queue]``) bounds it, ``step_lease`` keeps it short so a
    dead worker's step is taken over within ``step_lease + sweep_interval``.
    ``max_lease`` is the longest lease any worker of the fleet may hold (a
    lease ending further ahead counts as lapsed: an edited row, a clock set
    back); by default twice the longest horizon, never under ``step_lease``.
    ``retention`` (a ``timedelta``; off by default) is how long a settled run
    tree is kept: the beat's ``pikku.prune`` deletes older ones every minute.

    ``pooler`` names a connection pooler in front of PostgreSQL:
    ``"transaction"`` behind PgBouncer's transaction pooling (no prepared
    statements, ``wait()`` polls instead of listening), ``"session"`` behind
    session pooling; unset, the store warns when it sees one
    (:class:`~pikku_celery.errors.PoolerWarning`).
    """

    prune_task: Any
    """The registered ``pikku.prune`` task (see :mod:`pikku_celery.celery.retention`)."""

    def __init__(
        self,
        app: Celery,
        database_url: str | None = None,
        *,
        engine: sa.Engine | None = None,
        store: WorkflowStore | None = None,
        lease_service: LeaseService | None = None,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL,
        queue_leases: dict[str, float] | None = None,
        default_lease: float | None = None,
        step_lease: float = DEFAULT_STEP_LEASE,
        max_lease: float | None = None,
        orchestration_queue: str | None = None,
        install_beat: bool = True,
        upgrade_command: str | None = None,
        durable_claims: bool = False,
        pooler: Pooler | None = None,
        metrics: bool = False,
        tracing: bool = False,
        retention: timedelta | None = None,
        schedule_interval: float = DEFAULT_SCHEDULE_INTERVAL,
        **options: Any,
    ) -> None:
        if store is None and engine is None and database_url is None:
            raise ValueError("Pikku needs database_url=..., engine=... or store=...")
        # Settings are checked before anything is built: a bad one names itself.
        sweep_interval = positive_seconds(sweep_interval, "sweep_interval")
        self.retention = checked_retention(retention)
        """How long settled runs are kept (None: for good); see docs/guide/retention.md."""
        self.schedule_interval = positive_seconds(schedule_interval, "schedule_interval")
        """Seconds between beat's passes over the schedules (``pikku-schedules``)."""
        queue_leases_of_app = QueueLeases(app, queue_leases, default_lease, step_lease)
        if max_lease is not None and positive_seconds(max_lease, "max_lease") < step_lease:
            raise ValueError(
                f"max_lease ({max_lease!r} s) must be at least step_lease ({step_lease!r} s): "
                "it bounds every lease of the fleet, this worker's own included"
            )
        self.app = app
        self.sql_engine = engine or (make_engine(database_url) if database_url else None)
        if self.sql_engine is not None:
            use_pooler(self.sql_engine, check_pooler(pooler, self.sql_engine))
        store, lease_service = _default_ports(
            self.sql_engine, store, lease_service, upgrade_command, durable_claims, pooler
        )
        # A worker killed mid-sweep holds the sweep lease until it lapses; the
        # lease is renewed while a sweep runs, so it can be short.
        options.setdefault("sweep_lease_ttl", max(5.0, 2 * sweep_interval))
        self.queue_leases = queue_leases_of_app
        dispatcher = CeleryDispatcher(app, self.queue_leases, orchestration_queue)
        super().__init__(
            store,
            lease_service,
            dispatcher,
            orchestration_queue=orchestration_queue,
            max_lease=max_lease,
            **options,
        )
        self.sweep_interval = sweep_interval
        self._install_beat_entries = install_beat
        if self.sql_engine is not None:
            from ..schedule.sql import SQLScheduleStore

            self.schedule_store = SQLScheduleStore(self.sql_engine, upgrade_command=upgrade_command)
        # Workflows defined where Celery finds tasks (include=, imports,
        # autodiscover_tasks) are imported at the first name not found.
        self.registry.loader = lambda: import_task_modules(app)
        self._add_observers(metrics, tracing)
        _warn_unsafe_serializers(app)
        self._register_tasks()
        for extension in registered():  # durable canvas, once imported
            extension.install(self)
        install_retention(self, install_beat)
        if install_beat:
            self._install_beat()
        self._connect_signals(app)

    def _add_observers(self, metrics: bool, tracing: bool) -> None:
        """The observers ``metrics=`` and ``tracing=`` ask for, imported only then
        (each needs its extra)."""
        if metrics:
            from ..prometheus import PrometheusObserver  # prometheus_client: the web extra

            self.observers.add(PrometheusObserver())
        if tracing:
            from ..tracing import TracingObserver  # opentelemetry-api: the otel extra

            self.observers.add(TracingObserver(self))

    def _connect_signals(self, app: Celery) -> None:
        """Hook the worker's life: the broker check at start, connections
        rebuilt after fork, the store checked when ready, parked bodies released."""
        self._on_worker_start = broker_check_on_worker_start(app)
        signals.worker_process_init.connect(self._after_fork, weak=False)
        signals.worker_ready.connect(self._check_store, weak=False)
        signals.celeryd_init.connect(self._on_worker_start, weak=False)
        for shutdown in (signals.worker_shutdown, signals.worker_process_shutdown):
            # Parked bodies' finally blocks run at shutdown; one handler per
            # process, whichever Pikku connects it (it holds no Pikku).
            shutdown.connect(_release_parked, weak=False, dispatch_uid=_RELEASE_UID)

    # --- public helpers ------------------------------------------------------
    def lease_for_queue(self, queue: str | None = None) -> QueueLease:
        """The step lease of ``queue`` (default queue when None) and its source."""
        return self.queue_leases.lease(queue)

    @property
    def step_lease(self) -> float:
        """The liveness lease a step holds within its queue's horizon (seconds)."""
        return self.queue_leases.step_lease

    def takeover_within(self, queue: str | None = None) -> float:
        """The longest a step on ``queue`` whose worker died waits for another
        worker (seconds): its lease lapses within the lease's length of the
        death, and the next sweep sends it again."""
        return self.queue_leases.lease(queue).seconds + self.sweep_interval

    def _resolve_lease_bound_ms(self) -> int:
        if self.max_lease is not None:
            return round(self.max_lease * 1000)
        # Horizons, not this worker's leases: a worker of the same fleet
        # running with another step_lease, or an older release that leased
        # for the whole horizon, still holds a lease no longer than them.
        return round(LEASE_BOUND_FACTOR * self.queue_leases.longest_horizon() * 1000)

    def max_countdown(self, queue: str | None) -> float:
        """The longest countdown a message to ``queue`` may wait: under the
        broker's redelivery horizon for it."""
        return self.dispatcher.max_countdown(queue)

    def durable(self, signature: Any, idempotency_key: str | None = None) -> RunHandle[Any]:
        """Run a Celery canvas (signature, chain, group, chord, nested) durably.

        The canvas is checked whole and stored as one run before anything
        runs; each node then runs as a step of it. Refused at once, nothing
        stored: an unknown task, arguments that are not JSON, an unsupported
        option, a link cycle, a chord with an empty header, a canvas above
        ``max_input_bytes``. See the "Durable canvas" guide (docs/guide/canvas.md).
        The handle is a :class:`~pikku_celery.CanvasRun`.
        """
        return durable_canvas().start(self, signature, idempotency_key)

    def durable_run(self, run_id: str) -> RunHandle[Any]:
        """The :class:`~pikku_celery.CanvasRun` handle of a durable canvas's run id."""
        return durable_canvas().handle(self, run_id)

    # --- wiring --------------------------------------------------------------
    def _register_tasks(self) -> None:
        app = self.app
        pikku = self
        common: dict[str, Any] = {
            "serializer": "json",
            "ignore_result": True,
            "acks_late": True,
            "reject_on_worker_lost": True,
            # A message sent again through a store outage spends no retry budget.
            "max_retries": None,
        }

        self._common_options = common
        run_step = self._run_step_task(RUN_STEP)
        app.on_after_finalize.connect(self._add_rate_limited_run_steps, weak=False)

        @app.task(name=ORCHESTRATE, bind=True, shared=False, **common)
        def orchestrate(self: Any, *args: Any, **kwargs: Any) -> None:
            """One orchestration pass of the run (a wake-up)."""
            try:
                run_id, reason = orchestrate_message(args, kwargs)
                trace = message_trace(self.request)
                ride_out(
                    pikku,
                    lambda: pikku.orchestrate(run_id, reason, trace=trace),
                    f"a pass of run {run_id}",
                )
            except (InvalidIdError, PayloadError, InvalidMessageError) as exc:
                log.error("refused an orchestrate message %r %r: %s", args, kwargs, exc)
            except Exception as exc:
                if not pikku.is_transient(exc):
                    raise
                redeliver_later(self, exc, pikku.max_countdown(pikku.orchestration_queue))

        @app.task(name=SWEEP, shared=False, **common)
        def sweep() -> dict[str, Any]:
            """Wake what is stalled: lapsed leases, lost messages, due timers, idle runs."""
            report = pikku.sweep()
            return report.__dict__

        @app.task(name=SCHEDULES, shared=False, **common)
        def schedules() -> dict[str, Any]:
            """Start every schedule's due ticks, once (see ``Pikku.run_schedules``)."""
            return pikku.run_schedules().__dict__

        self.schedules_task = schedules
        self.run_step_task = run_step
        self.orchestrate_task = orchestrate
        self.sweep_task = sweep

    def _run_step_task(self, name: str, rate_limit: str | None = None) -> Any:
        pikku, app = self, self.app

        @app.task(name=name, bind=True, shared=False, rate_limit=rate_limit, **self._common_options)
        def run_step(self: Any, *args: Any, **kwargs: Any) -> None:
            """Claim the step, run the user's task as this attempt, advance the run."""
            try:
                run_id, step_id, task_name, queue = step_message(args, kwargs)
                if task_name not in app.tasks:
                    pikku.refuse_unknown_task(step_id, task_name, run_id)
                    return
                body = CeleryStepBody(app, self.request)
                trace = message_trace(self.request)
                pikku.execute_step(
                    run_id,
                    step_id,
                    task_name,
                    body,
                    queue,
                    trace=trace,
                    delivery=message_delivery(self.request),
                )
            except (InvalidIdError, PayloadError, InvalidMessageError) as exc:
                log.error("refused a step message %r %r: %s", args, kwargs, exc)
            except Exception as exc:
                if not pikku.is_transient(exc):
                    raise
                queue = step_message(args, kwargs)[3]
                redeliver_later(self, exc, pikku.max_countdown(queue))

        return run_step

    def refuse_unknown_task(self, step_id: str, task_name: str, run_id: str | None = None) -> None:
        """A step message for a task this worker lacks is not claimed: during a
        rolling deploy a worker that has the task (or the sweep) takes it."""
        step = self.store.get_step(check_id(step_id, "step id"), run_id=run_id)
        if step is not None and step.task_name != task_name:
            log.error(
                "refused a step message: %s",
                WorkflowStepFunctionMismatchError(step_id, step.task_name, task_name),
            )
            return
        log.error(
            "step %s names task %r, which this worker's Celery app does not have; "
            "left for a worker that does",
            step_id,
            task_name,
        )

    def _add_rate_limited_run_steps(self, **_: Any) -> None:
        """A task with a ``rate_limit`` keeps it as a step: its steps travel as
        ``pikku.run_step:<task>``, a run-step task with the same rate limit
        (Celery's workers limit the rate per task name)."""
        for name, task in list(self.app.tasks.items()):
            if name.startswith("pikku.") or not getattr(task, "rate_limit", None):
                continue
            proxy = rate_limited_run_step(name)
            if proxy not in self.app.tasks:
                self._run_step_task(proxy, task.rate_limit)

    def _install_beat(self) -> None:
        schedule = dict(self.app.conf.beat_schedule or {})
        schedule[BEAT_ENTRY] = {
            "task": SWEEP,
            "schedule": self.sweep_interval,
            # No expires: an expiry is an absolute time on beat's clock, and a
            # worker whose clock runs ahead would discard every sweep. Sweeps
            # that pile up while no worker runs are harmless: each holds the
            # sweep lease, so they run one at a time and find little to do.
            "options": {"serializer": "json"},
        }
        self.app.conf.beat_schedule = schedule

    def _schedule_defined(self, schedule: Schedule) -> None:
        """The first schedule installs ``pikku-schedules`` into beat (unless
        ``install_beat=False``)."""
        if not self._install_beat_entries:
            return
        entries = dict(self.app.conf.beat_schedule or {})
        if SCHEDULES_BEAT_ENTRY in entries:
            return
        entries[SCHEDULES_BEAT_ENTRY] = {
            "task": SCHEDULES,
            "schedule": self.schedule_interval,
            # No expires (see the sweep's): a late pass starts the same ticks.
            "options": {"serializer": "json"},
        }
        self.app.conf.beat_schedule = entries

    def run_schedules(self, grace: float | None = None) -> ScheduleReport:
        """One pass over the schedules now, the store made ready first (see
        :meth:`WorkflowEngine.run_schedules`). A tick within two
        ``schedule_interval`` of now is late, not missed (beat's passes
        jitter): it starts even with ``catch_up=0``."""
        self._prepare_store()
        return super().run_schedules(2 * self.schedule_interval if grace is None else grace)

    def sweep(self, limit: int = 200, max_pages: int = SWEEP_MAX_PAGES) -> SweepReport:
        """One sweep now (see :meth:`WorkflowEngine.sweep`). The store is made
        ready first: the sweep's own lease lives in its tables, which on
        SQLite the store creates on first use."""
        self._prepare_store()
        return super().sweep(limit, max_pages)

    def prune(self, time_budget: float | None = TICK_SECONDS) -> PruneReport:
        """One prune now, as the beat's ``pikku.prune`` does: under the prune
        lease, settled run trees older than :attr:`retention` go, in batches
        for at most ``time_budget`` seconds (None: to the end). Without a
        retention it prunes nothing (``skipped``)."""
        if self.retention is None:
            return PruneReport(skipped=True)
        self._prepare_store()
        return prune(self, self.retention, time_budget=time_budget)

    def _prepare_store(self) -> None:
        from ..store.sql import SQLWorkflowStore

        if isinstance(self.store, SQLWorkflowStore):
            self.store.prepare()

    def _check_store(self, **_: Any) -> None:
        """A worker says at start when the store is not ready (no tables, no
        database), rather than at its first message."""
        try:
            self._prepare_store()
        except PikkuError as exc:
            log.error("pikku-celery's store is not ready: %s", exc)

    def close(self) -> None:
        """Close every connection pikku opened: the store's and leases'
        (Redis included), the settle listener thread and its LISTEN
        connection, and the engine's pool. Idempotent; also what leaving
        ``with Pikku(...) as pikku:`` does. The Pikku stays usable: pools
        and the listener open again on demand (so closing before a test
        database is dropped costs nothing later). Close at a quiet moment: a
        connection another thread is using right then is not closed."""
        try:
            super().close()
        finally:
            if self.sql_engine is not None:
                self.sql_engine.dispose(close=True)

    def disconnect_signals(self) -> None:
        """Stop hearing Celery's worker signals (a pool process starting, the
        worker ready or starting). For a Pikku dropped in a process that goes
        on (a test, a script): Celery keeps its handlers, and with them the
        Pikku, for as long as the process lives."""
        signals.worker_process_init.disconnect(self._after_fork)
        signals.worker_ready.disconnect(self._check_store)
        signals.celeryd_init.disconnect(self._on_worker_start)

    def _after_fork(self, **_: Any) -> None:
        # Connections made before fork must not be shared with the parent.
        if self.sql_engine is not None:
            self.sql_engine.dispose(close=False)


_RELEASE_UID = "pikku_celery.release_parked_bodies"


def _release_parked(**_: Any) -> None:
    release_all()


UNSAFE_CONTENT = {"pickle", "application/x-python-serialize", "yaml", "application/x-yaml"}


def _warn_unsafe_serializers(app: Celery) -> None:
    """pikku sends JSON only; a worker that also accepts pickle would still
    unpickle a forged message before any task code could refuse it."""
    accepted = {str(c) for c in (app.conf.accept_content or ())}
    unsafe = sorted(accepted & UNSAFE_CONTENT)
    if unsafe:
        log.warning(
            "Celery app %r accepts %s: pikku's messages are JSON, and a worker that "
            "accepts these can be made to run code by a forged message; set "
            "accept_content=['json'] unless other tasks need them",
            app.main,
            ", ".join(unsafe),
        )
