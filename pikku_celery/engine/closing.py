"""Closing what an engine's ports opened: connections, threads, clients.

A port that holds something to let go of (a pool, a listener thread, a
Redis connection) says so by having ``close()``; the engine closes each such
port once per :meth:`~pikku_celery.engine.core.WorkflowEngine.close`. Closing
releases, it does not retire: what a port opens on demand it opens again if
it is used afterwards, so closing is safe at any quiet moment (between
tests, before a database is dropped, at shutdown).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Closable(Protocol):
    """A port holding connections or threads of its own."""

    def close(self) -> None:
        """Let go of them; safe to call again, and the port stays usable."""
        ...


def close_each(parts: Iterable[object]) -> None:
    """Close every closable part once, all of them even if one fails; the
    first failure is raised after the rest are closed."""
    seen: set[int] = set()
    failure: BaseException | None = None
    for part in parts:
        if id(part) in seen or not isinstance(part, Closable):
            continue
        seen.add(id(part))
        try:
            part.close()
        except Exception as exc:
            log.warning("closing %r failed: %s", part, exc)
            failure = failure or exc
    if failure is not None:
        raise failure
