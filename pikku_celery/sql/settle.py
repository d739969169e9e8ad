"""Waking ``RunHandle.wait`` on PostgreSQL: one LISTEN connection per process.

A pass that settles a run sends ``NOTIFY pikku_run_settled, '<run id>'``
after commit. One background thread per store holds the LISTEN connection
(outside the pool: LISTEN needs autocommit) and sets the events of whoever
watches that run, so a wait costs no connection set-up and no polling.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

log = logging.getLogger(__name__)

SETTLED_CHANNEL = "pikku_run_settled"


class SettleListener:
    """Fans the settle notifications of one database out to waiting threads."""

    def __init__(self, engine: sa.Engine) -> None:
        self._engine = engine
        self._lock = threading.Lock()
        self._watchers: dict[str, set[threading.Event]] = {}
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = 0

    @contextmanager
    def watch(self, run_id: str) -> Iterator[Callable[[float], None]]:
        """Register for ``run_id``'s settle before the caller reads its status.

        Yields ``wait(timeout)``; callers re-read the status after each wait
        (a wait may also end by timeout, e.g. while the listener reconnects).
        """
        event = threading.Event()
        with self._lock:
            self._ensure_thread()
            self._watchers.setdefault(run_id, set()).add(event)
        self._listening.wait(2.0)  # the LISTEN is in place before the first read

        def wait(timeout: float) -> None:
            event.wait(timeout)
            event.clear()

        try:
            yield wait
        finally:
            with self._lock:
                waiting = self._watchers.get(run_id)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._watchers[run_id]

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._listening.clear()
        self._thread = threading.Thread(target=self._run, name="pikku-settle", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._listen()
            except Exception as exc:  # reconnect; waiters re-check meanwhile
                self._listening.clear()
                log.info("settle listener reconnecting: %s", exc)
                threading.Event().wait(1.0)

    def _listen(self) -> None:
        import psycopg

        cargs, ckwargs = self._engine.dialect.create_connect_args(self._engine.url)
        conn: Any = psycopg.connect(*cargs, **ckwargs, autocommit=True)
        try:
            conn.execute(f"LISTEN {SETTLED_CHANNEL}")
            self._listening.set()
            self._wake_all()  # anything settled while we were not listening
            for note in conn.notifies():
                with self._lock:
                    events = list(self._watchers.get(note.payload, ()))
                for event in events:
                    event.set()
        finally:
            conn.close()

    def _wake_all(self) -> None:
        with self._lock:
            events = [e for waiting in self._watchers.values() for e in waiting]
        for event in events:
            event.set()
