"""pytest-celery's node classes over local components.

The nodes are pytest-celery's own (a test may check ``isinstance(node,
RabbitMQTestBroker)``), with two changes: a log is waited for by polling it
every 50 ms (pytest-celery polls a container's once a second), and a worker's
processes are read with psutil from its process group (not with ``docker
exec``). :class:`LocalTestSetup` carries each node's transport options into
the setup's app: a Redis node's key prefix must reach Celery's configuration.
"""

from __future__ import annotations

import time
from typing import Any

from pytest_celery import (
    CeleryTestNode,
    CeleryTestSetup,
    CeleryTestWorker,
    RabbitMQTestBroker,
    RedisTestBackend,
    RedisTestBroker,
)

from .services import LocalRabbitMQContainer
from .worker import LocalWorkerContainer

LOG_POLL = 0.05


class FastLogs(CeleryTestNode):
    """``wait_for_log`` and its assertions, polling every 50 ms."""

    def wait_for_log(self, log: str, message: str = "", timeout: int = 60) -> None:
        """Wait for ``log`` in the node's output, polling often (a local log is cheap to read)."""
        deadline = time.monotonic() + timeout
        while log not in self.logs():
            if time.monotonic() >= deadline:
                what = message or f"{self.name()} to log {log!r}"
                raise TimeoutError(f"waited {timeout} s for {what}")
            time.sleep(LOG_POLL)  # polling the log, with a deadline

    def assert_log_exists(self, log: str, message: str = "", timeout: int = 60) -> None:
        """Fail unless ``log`` shows up in the node's output within ``timeout`` seconds."""
        try:
            self.wait_for_log(log, message, timeout)
        except TimeoutError:
            raise AssertionError(f"{self.name()} did not log {log!r} within {timeout} s") from None

    def assert_log_does_not_exist(self, log: str, message: str = "", timeout: int = 1) -> None:
        """Fail if ``log`` shows up in the node's output within ``timeout`` seconds."""
        try:
            self.wait_for_log(log, message, timeout)
        except TimeoutError:
            return
        raise AssertionError(f"{self.name()} logged {log!r} within {timeout} s")


class LocalTestWorker(FastLogs, CeleryTestWorker):
    """A :class:`~pytest_celery.CeleryTestWorker` on a :class:`LocalWorkerContainer`."""

    container: LocalWorkerContainer

    @property
    def pid(self) -> int | None:
        """The worker's main process (its process group's leader)."""
        return self.container.pid

    def stop(self, timeout: float = 15.0) -> None:
        """A warm shutdown (SIGTERM), SIGKILL after ``timeout`` seconds."""
        self.container.stop(timeout)

    def get_running_processes_info(
        self, columns: list[str] | None = None, filters: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """The worker's processes (main process, pool, embedded beat) with psutil."""
        import psutil

        columns = columns or [
            "pid",
            "name",
            "username",
            "cmdline",
            "cpu_percent",
            "memory_percent",
            "create_time",
        ]
        if self.container.pid is None:
            return []
        try:
            main = psutil.Process(self.container.pid)
            procs = [main, *main.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        infos: list[dict[str, Any]] = []
        for proc in procs:
            try:
                infos.append(proc.as_dict(attrs=columns))
            except psutil.NoSuchProcess:
                continue
        if filters:
            infos = [i for i in infos if all(i.get(k) == v for k, v in filters.items())]
        return infos


class LocalRedisTestBroker(FastLogs, RedisTestBroker):
    """A Redis broker node: a key prefix of its own on a running Redis."""

    def flush(self) -> int:
        """Lose every message of this broker (queued and unacked), as FLUSHDB would."""
        return int(self.container.flush())


class LocalRabbitMQTestBroker(FastLogs, RabbitMQTestBroker):
    """A RabbitMQ broker node: a virtual host on a running RabbitMQ."""


class LocalRedisTestBackend(FastLogs, RedisTestBackend):
    """A Redis result backend node: a key prefix of its own on a running Redis."""


class LocalTestSetup(CeleryTestSetup):
    """:class:`~pytest_celery.CeleryTestSetup` whose app gets its nodes' transport options.

    It also tells each RabbitMQ node which queues its workers consume, so the
    node deletes them at teardown.
    """

    @classmethod
    def config(cls, celery_worker_cluster_config: dict[str, Any]) -> dict[str, Any]:
        """pytest-celery's setup configuration, with the local nodes' transport options."""
        config: dict[str, Any] = super().config(celery_worker_cluster_config)
        broker = celery_worker_cluster_config.get("celery_broker_cluster_config") or {}
        backend = celery_worker_cluster_config.get("celery_backend_cluster_config") or {}
        if broker.get("transport_options"):
            config["broker_transport_options"] = dict(broker["transport_options"])
        if backend.get("transport_options"):
            config["result_backend_transport_options"] = dict(backend["transport_options"])
        config.setdefault("broker_connection_retry_on_startup", True)
        return config

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        queues = {
            queue
            for worker in (self.worker_cluster or ())
            if isinstance(worker.container, LocalWorkerContainer)
            for queue in worker.container.queues
        }
        for broker in self.broker_cluster or ():
            if isinstance(broker.container, LocalRabbitMQContainer):
                broker.container.forget_at_teardown(queues)
