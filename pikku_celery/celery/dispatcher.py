"""The Celery adapter of the dispatcher port: messages out, tasks and queues known."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from celery import Celery

from ..engine.observe import run_trace
from ..engine.task_id import TIME_LIMITS
from ..errors import UnknownTaskError
from ..model.values import StepState
from .inprocess import InProcessDelivery
from .messages import TRACE_HEADER
from .queues import QueueLeases
from .request_extras import message_options
from .routes import ROUTING_OPTIONS, routed_queue
from .step_body import CeleryStepBody
from .worker_process import WorkerProcess

RUN_STEP = "pikku.run_step"
ORCHESTRATE = "pikku.orchestrate"
SWEEP = "pikku.sweep"
SCHEDULES = "pikku.schedules"


def rate_limited_run_step(task_name: str) -> str:
    """The run-step task that carries the rate limit of ``task_name``."""
    return f"{RUN_STEP}:{task_name}"


# A countdown must end before the broker would redeliver the message (Redis
# and SQS restore it after the visibility timeout; RabbitMQ closes a channel
# that holds an unacked message past its consumer timeout).
COUNTDOWN_MARGIN = 0.9


class CeleryDispatcher:
    """Sends pikku's own messages (JSON only) to the right queues."""

    def __init__(
        self, app: Celery, leases: QueueLeases, orchestration_queue: str | None = None
    ) -> None:
        self.app = app
        self.leases = leases
        self.orchestration_queue = orchestration_queue
        self._router: Any = None
        self._routes: dict[tuple[str, Any], dict[str, Any]] = {}
        self.in_process = InProcessDelivery(app)
        self.worker = WorkerProcess(app)

    # --- tasks and queues ----------------------------------------------------
    def task_name(self, task: Any) -> str:
        name = task if isinstance(task, str) else getattr(task, "name", None)
        if not isinstance(name, str) or not name:
            raise UnknownTaskError(
                f"{task!r} is not a Celery task: pass a task object or its registered name"
            )
        if name not in self.app.tasks:
            raise UnknownTaskError(
                f"task {name!r} is not registered with Celery app {self.app.main!r}"
            )
        if name.startswith("pikku."):
            raise UnknownTaskError(f"pikku's own task {name!r} cannot be a workflow step")
        return name

    def task_queue(self, task_name: str, route: dict[str, Any] | None = None) -> str | None:
        return routed_queue(self.app.conf.task_queues, self._route(task_name, route))

    def lease_ms(self, queue: str | None) -> int:
        return max(1, round(self.leases.lease(queue).seconds * 1000))

    def longest_lease_ms(self) -> int:
        return max(self.lease_ms(lease.queue) for lease in self.leases.table())

    def max_countdown(self, queue: str | None) -> float:
        # The broker's horizon, not the step lease: a countdown is the broker's.
        return self.leases.lease(queue).horizon * COUNTDOWN_MARGIN

    def eager_body(
        self, task_name: str, queue: str | None, carrier: Callable[[StepState], Any]
    ) -> Callable[[StepState], Any] | None:
        """``carrier`` itself (it runs any task of the app) when a step of
        ``task_name`` on ``queue`` may run in this worker process now."""
        if not isinstance(carrier, CeleryStepBody) or self.app.conf.task_always_eager:
            return None
        if self.worker.stopping or not self.worker.consumes(queue):
            return None
        task = self.app.tasks.get(task_name)
        if task is None or task_name.startswith("pikku."):
            return None
        # Celery enforces a rate limit per message: such a step travels as
        # one. A task's own time limits are enforced in process for an eager
        # step (pikku_celery.engine.interrupt), unless the carrying message
        # has a time limit: Celery's timer covers its whole call, every
        # eager step in it. So does a time limit set for every task: then
        # every step travels.
        if task.rate_limit or carrier.under_message_limit():
            return None
        conf = self.app.conf
        if conf.task_time_limit is not None or conf.task_soft_time_limit is not None:
            return None
        return carrier

    # --- sending -------------------------------------------------------------
    def send_step(self, step: StepState, countdown: float = 0.0) -> None:
        task_name = step.task_name or ""
        name, options = self._step_options(task_name)
        args = (step.run_id, step.id, step.attempt, step.task_name, step.queue)
        # Celery's tools (worker log lines, inspect, events, Flower) name the
        # user's task, not pikku's carrier.
        options = {**options, "shadow": task_name}
        route = self._route(task_name, step.route)
        for key in ("exchange", "routing_key", "priority"):
            if route.get(key) is not None:
                options[key] = route[key]
        for key in TIME_LIMITS:  # the step's own, over its task's
            if (step.route or {}).get(key) is not None:
                options[key] = step.route[key]  # type: ignore[index]
        options.update(message_options(step.route))  # its ids and stamps, in its headers
        queue = route.get("queue")
        if queue is None and "exchange" not in options:
            queue = step.queue or self.leases.default_queue()
        self._send(name, args, queue, countdown, options)

    def _route(self, task_name: str, route: dict[str, Any] | None) -> dict[str, Any]:
        """Celery's route of ``task_name``, as ``apply_async`` routes the task:
        the task's own routing options (``@app.task(queue=...)``) with
        ``ctx.step``'s over them, then ``task_routes``. Kept per task name,
        options and router: Celery reads task_routes once into its router
        too, and every step of a task asks, when it is recorded and each time
        it is sent."""
        router = self.app.amqp.router
        if router is not self._router:
            self._router, self._routes = router, {}
        routing = {k: v for k, v in (route or {}).items() if k in ROUTING_OPTIONS}
        key = (task_name, tuple(sorted(routing.items())) or None)
        found = self._routes.get(key)
        if found is None:
            task = self.app.tasks.get(task_name)
            options = {
                name: value
                for name in ROUTING_OPTIONS
                if (value := getattr(task, name, None)) is not None
            }
            options.update(routing)
            found = self._routes[key] = dict(router.route(options, task_name))
        return found

    def wake_run(self, run_id: str, countdown: float = 0.0, reason: str = "") -> None:
        queue = self.orchestration_queue or self.leases.default_queue()
        self._send(ORCHESTRATE, (run_id, reason), queue, countdown, _NO_OPTIONS)

    def _step_options(self, task_name: str) -> tuple[str, dict[str, Any]]:
        """The run-step task and the options a step of ``task_name`` travels with:
        the time limits and rate limit its own task declares."""
        task = self.app.tasks.get(task_name)
        if task is None:
            return RUN_STEP, _NO_OPTIONS
        options: dict[str, Any] = {}
        if task.time_limit is not None:
            options["time_limit"] = task.time_limit
        if task.soft_time_limit is not None:
            options["soft_time_limit"] = task.soft_time_limit
        name = RUN_STEP
        if task.rate_limit and rate_limited_run_step(task.name) in self.app.tasks:
            name = rate_limited_run_step(task.name)
        return name, options

    def _send(
        self,
        name: str,
        args: tuple[Any, ...],
        queue: Any,
        countdown: float,
        options: dict[str, Any],
    ) -> None:
        carrier = run_trace.get()
        if carrier is not None:  # tracing on: the message joins its run's trace
            options = {**options, "headers": {TRACE_HEADER: carrier}}
        if self.app.conf.task_always_eager:
            self.in_process.deliver(name, args, countdown, {**options, "queue": queue})
            return
        # pikku's tasks store no result: no result subscription on send (a web
        # app starting runs would otherwise subscribe and unsubscribe per
        # message), no child result on the sending task. Their arguments are
        # ids and names, so their repr is the repr Celery's saferepr would make.
        self.app.send_task(
            name,
            args=args,
            queue=queue,
            countdown=countdown or None,
            serializer="json",
            task_id=str(uuid.uuid4()),
            ignore_result=True,
            add_to_parent=False,
            argsrepr=repr(args),
            kwargsrepr="{}",
            **options,
        )


_NO_OPTIONS: dict[str, Any] = {}
