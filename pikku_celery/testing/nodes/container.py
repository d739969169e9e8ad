"""What pytest-celery's nodes ask of a container, answered by a local component.

pytest-celery's :class:`~pytest_celery.CeleryTestNode` wraps a Docker
container and calls a handful of its members: ``id`` and ``name``,
``status``, ``ready()``, ``logs()``, ``kill(signal=...)``, ``reload()``,
``restart(timeout=...)``, ``teardown()``, ``celeryconfig`` and ``client``.
:class:`LocalContainer` is that surface, for components that are a local
process or a private corner of a server that is already running.
"""

from __future__ import annotations

import uuid
from typing import Any

from .process import Signal


class LocalContainer:
    """The container surface pytest-celery's nodes use; subclasses fill it in.

    ``id`` is random hex, unique per component, so two components of one test
    never share a name, a queue prefix or a worker hostname.
    """

    def __init__(self, name: str | None = None) -> None:
        self.id = uuid.uuid4().hex
        self.name = name or f"{type(self).__name__}-{self.id[:12]}"

    @property
    def status(self) -> str:
        """``created``, ``running`` or ``exited``, as Docker names them."""
        return "running"

    def start(self) -> LocalContainer:
        """Start what the node runs (nothing for a node on a running server)."""
        return self

    def ready(self) -> bool:
        """Wait until the component serves; raise (saying why) if it cannot."""
        return True

    def logs(self) -> str:
        """The node's output so far."""
        return ""

    def kill(self, signal: Signal = "SIGKILL") -> None:
        """Send ``signal`` to what the node runs."""
        raise NotImplementedError(f"{self.name} cannot be sent signals")

    def reload(self) -> None:
        """Docker's re-read of the container's state: a local component's is always current."""

    def restart(self, timeout: float = 60) -> None:
        """Stop and start again, ready within ``timeout`` seconds."""
        raise NotImplementedError(f"{self.name} cannot be restarted")

    def teardown(self) -> None:
        """Stop the component and remove what it made."""

    @property
    def celeryconfig(self) -> dict[str, Any]:
        """The Celery settings this component stands for (``url``, ``host_url``, ...)."""
        raise NotImplementedError(f"{self.name} has no Celery configuration")

    @property
    def client(self) -> Any:
        """A client of the node's service, as pytest-celery's nodes expect (None here)."""
        raise NotImplementedError(f"{self.name} has no client")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.status})>"
