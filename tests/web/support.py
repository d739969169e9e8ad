"""Helpers of the run page's tests: serving an app on loopback, snapshots of a store."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pikku_celery.store import WorkflowStore
from pikku_celery.web.serve import WsgiApp, make_server


@contextmanager
def served(app: WsgiApp) -> Iterator[str]:
    """``app`` on waitress, on a free loopback port, in a thread: its base URL."""
    server = make_server(app, "127.0.0.1", 0, threads=4)
    thread = threading.Thread(target=server.run, name="waitress", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}/"
    finally:
        server.close()
        thread.join(10)
        assert not thread.is_alive(), "the server did not stop"


def snapshot(store: WorkflowStore) -> list[Any]:
    """Everything the store holds, run by run: to show a refused request wrote nothing."""
    runs = store.list_runs(limit=10_000)
    return [
        (
            run,
            store.get_steps(run.id),
            store.get_attempts(run.id),
            store.get_signals(run.id),
            store.audit_trail(run.id),
        )
        for run in runs
    ]
