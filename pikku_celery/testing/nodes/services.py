"""Brokers and result backends on servers that are already running.

No server is started: a Redis node is a key prefix of its own on a running
Redis (kombu's and Celery's ``global_keyprefix``), a RabbitMQ node a virtual
host (made for the test session with ``rabbitmqctl`` when it can be, else
the URL's own) whose queues it deletes at teardown. Such a node cannot be
killed or restarted (the server is everyone's); :meth:`LocalRedisContainer.flush`
loses every message of its broker, as a FLUSHDB of a private server would.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from kombu.utils.url import url_to_parts

from .container import LocalContainer

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"


def _wait_reachable(name: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise ConnectionError(f"{name} is not reachable: {exc}") from exc
        time.sleep(0.1)  # polling a server that may be starting, with a deadline


class LocalRedisContainer(LocalContainer):
    """A private key prefix on the Redis server at ``url``.

    ``celeryconfig`` carries ``transport_options`` (``{"global_keyprefix":
    prefix}``): pikku's setup puts them in ``broker_transport_options`` or
    ``result_backend_transport_options``, so every key Celery writes for this
    node, messages, unacked and bindings included, starts with ``prefix``.
    """

    def __init__(
        self, url: str = DEFAULT_REDIS_URL, prefix: str | None = None, name: str | None = None
    ) -> None:
        super().__init__(name)
        self.url = url
        self.prefix = prefix if prefix is not None else f"pikku-node-{self.id[:12]}:"

    def _redis(self, decode: bool = True) -> Any:
        import redis

        return redis.Redis.from_url(self.url, decode_responses=decode)

    @property
    def client(self) -> Any:
        """A client of the server (not prefixed: this node's keys start with ``prefix``)."""
        return self._redis()

    @property
    def celeryconfig(self) -> dict[str, Any]:
        parts = url_to_parts(self.url)
        return {
            "url": self.url,
            "host_url": self.url,
            "hostname": parts.hostname,
            "port": parts.port,
            "vhost": parts.path or "0",
            "transport_options": {"global_keyprefix": self.prefix},
        }

    def ready(self, timeout: float = 10.0) -> bool:
        client = self._redis()
        try:
            _wait_reachable(f"Redis at {self.url}", client.ping, timeout)
        finally:
            client.close()
        return True

    def own_keys(self) -> list[str]:
        """This node's keys on the server."""
        client = self._redis()
        try:
            return [str(k) for k in client.scan_iter(match=f"{self.prefix}*", count=1000)]
        finally:
            client.close()

    def flush(self) -> int:
        """Delete every key of this node (queued and unacked messages, results,
        bindings): the broker forgets everything. Returns how many went."""
        client = self._redis(decode=False)
        try:
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
            return len(keys)
        finally:
            client.close()

    def teardown(self) -> None:
        self.flush()


def _with_vhost(url: str, vhost: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{quote(vhost, safe='')}", parts.query, ""))


class RabbitMQVhost:
    """A virtual host made with ``rabbitmqctl`` and deleted by :meth:`delete`."""

    def __init__(self, name: str, user: str) -> None:
        self.name = name
        self.user = user

    @staticmethod
    def available() -> bool:
        """Whether ``rabbitmqctl`` can be run here (a local server)."""
        return shutil.which("rabbitmqctl") is not None

    def _ctl(self, *args: str) -> None:
        subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)

    def create(self) -> RabbitMQVhost:
        """Create the virtual host and give the user every permission on it."""
        self._ctl("add_vhost", self.name)
        self._ctl("set_permissions", "-p", self.name, self.user, ".*", ".*", ".*")
        return self

    def delete(self) -> None:
        """Delete the virtual host and everything in it."""
        self._ctl("delete_vhost", self.name)


class LocalRabbitMQContainer(LocalContainer):
    """The RabbitMQ virtual host of ``url`` on a running server.

    Queues are deleted at teardown: the ones named with :meth:`forget_at_teardown`
    (pikku's setup names its workers' queues).
    """

    def __init__(self, url: str = DEFAULT_AMQP_URL, name: str | None = None) -> None:
        super().__init__(name)
        self.url = url
        self._queues: set[str] = set()

    @property
    def vhost(self) -> str:
        """The virtual host this node's connections use."""
        return unquote(urlsplit(self.url).path[1:]) or "/"

    @property
    def celeryconfig(self) -> dict[str, Any]:
        parts = url_to_parts(self.url)
        return {
            "url": self.url,
            "host_url": self.url,
            "hostname": parts.hostname,
            "port": parts.port,
            "vhost": self.vhost,
        }

    @property
    def client(self) -> Any:
        """A kombu connection to the virtual host (close it after use)."""
        from kombu.connection import Connection

        return Connection(self.url, connect_timeout=5)  # type: ignore[no-untyped-call]

    def ready(self, timeout: float = 10.0) -> bool:
        def connect() -> None:
            with self.client as conn:
                conn.ensure_connection(max_retries=1)

        _wait_reachable(f"RabbitMQ at {self.url}", connect, timeout)
        return True

    def forget_at_teardown(self, queues: Iterable[str]) -> None:
        """Delete ``queues`` when the node is torn down."""
        self._queues.update(queues)

    def delete_queues(self, queues: Iterable[str]) -> None:
        """Delete ``queues`` now (missing ones are skipped)."""
        with self.client as conn:
            channel = conn.channel()
            for queue in queues:
                try:
                    channel.queue_delete(queue)
                except Exception:
                    channel = conn.channel()  # a failed call closes the channel

    def teardown(self) -> None:
        if self._queues:
            self.delete_queues(sorted(self._queues))
            self._queues.clear()


def amqp_url_in_vhost(url: str, vhost: str) -> str:
    """``url`` with its virtual host replaced by ``vhost``."""
    return _with_vhost(url, vhost)
