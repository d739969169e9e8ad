"""Waking ``RunHandle.wait`` on PostgreSQL: one LISTEN connection per process.

A pass that settles a run sends ``NOTIFY pikku_run_settled`` after commit,
its payload the run id and, when they fit, the run's status, output and
error (:func:`settle_notice`). One background thread per store holds the
LISTEN connection while anyone waits (and :data:`IDLE_AFTER` seconds more),
keeps the outcomes the latest notices carried, and wakes whoever watches
those runs. So a wait costs no connection set-up and no
polling, and a run this process started while it listened is waited for
without reading it at all.

The LISTEN connection is taken from the engine's pool, so it is made by the
pool's own connect hooks (Django's integration points them at the test
database, where the NOTIFY is sent), and it is never returned there: it is
closed when the listener stops (:meth:`SettleListener.close`), since a
connection still listening must not serve anyone else.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import sqlalchemy as sa

from ..model.values import RunStatus, Settled

log = logging.getLogger(__name__)

SETTLED_CHANNEL = "pikku_run_settled"
NOTICE_BYTES = 7900  # PostgreSQL's payload limit is 8000 bytes
RECENT_KEPT = 1024  # outcomes of at most ~8 KB each
IDLE_AFTER = 30.0
"""Seconds with nobody waiting after which the listener lets its connection
go: a process that waits now and then (a web worker, a test suite making a
store per test) holds no LISTEN connection between its waits."""


def settle_notice(run_id: str, status: str, output: str | None, error: str | None) -> str:
    """The payload announcing that ``run_id`` settled: its id, and its
    status, output and error (as stored JSON text) when they fit."""
    full = f"{run_id}\n{status}\n{output or 'null'}\n{error or 'null'}"
    return full if len(full.encode()) <= NOTICE_BYTES else run_id


def read_notice(payload: str) -> tuple[str, Settled | None]:
    """The run id of a notice, and the outcome it carries (if any)."""
    run_id, _, rest = payload.partition("\n")
    if not rest:
        return run_id, None
    try:
        status, output, error = rest.split("\n", 2)
        return run_id, Settled(RunStatus(status), json.loads(output), json.loads(error))
    except ValueError:  # a notice from elsewhere: waiters read the run
        return run_id, None


class Watch:
    """One waiter's registration (see :class:`pikku_celery.ports.store.SettleWatch`)."""

    def __init__(self, listener: SettleListener, run_id: str) -> None:
        self._listener = listener
        self._run_id = run_id
        self.event = threading.Event()

    def wait(self, timeout: float) -> None:
        """Return when a notice for the run came (or after ``timeout`` seconds)."""
        self.event.wait(timeout)
        self.event.clear()

    def settled(self) -> Settled | None:
        """The outcome a notice for the run carried, if one came."""
        return self._listener.recent_outcome(self._run_id)

    def heard_since(self, since: float) -> bool:
        """Whether the listener has listened without a break since ``since``."""
        began = self._listener.listening_since
        return began is not None and began < since


class SettleListener:
    """Fans the settle notifications of one database out to waiting threads."""

    def __init__(self, engine: sa.Engine, idle_after: float = IDLE_AFTER) -> None:
        self._engine = engine
        self._idle_after = idle_after
        self._idle_since: float | None = None
        self._lock = threading.Lock()
        self._watchers: dict[str, set[threading.Event]] = {}
        self._recent: OrderedDict[str, Settled] = OrderedDict()
        self._listening = threading.Event()
        self.listening_since: float | None = None  # time.monotonic() of the LISTEN
        self._thread: threading.Thread | None = None
        self._stop: _Stop | None = None
        self._pid = 0

    @contextmanager
    def watch(self, run_id: str) -> Iterator[Watch]:
        """Register for ``run_id``'s settle before the caller reads its status.

        Callers re-check after each wait (a wait may also end by timeout,
        e.g. while the listener reconnects).
        """
        watch = Watch(self, run_id)
        with self._lock:
            self._ensure_thread()
            self._idle_since = None
            self._watchers.setdefault(run_id, set()).add(watch.event)
        self._listening.wait(2.0)  # the LISTEN is in place before the first read
        try:
            yield watch
        finally:
            with self._lock:
                waiting = self._watchers.get(run_id)
                if waiting is not None:
                    waiting.discard(watch.event)
                    if not waiting:
                        del self._watchers[run_id]

    def recent_outcome(self, run_id: str) -> Settled | None:
        """The outcome the latest notices carried for ``run_id``."""
        with self._lock:
            return self._recent.get(run_id)

    @property
    def running(self) -> bool:
        """Whether this process has a listener thread (and so a LISTEN connection)."""
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and close its connection; the next watch starts
        them again. Waiters are woken and fall back to reading their run."""
        with self._lock:
            thread, stop = self._thread, self._stop
            self._thread = self._stop = None
            mine = self._pid == os.getpid()
        if stop is not None and mine:
            stop.set()
        if thread is not None and mine and thread is not threading.current_thread():
            thread.join(timeout)
        self._wake_all()

    def _ensure_thread(self) -> None:
        if self.running:
            return
        self._pid = os.getpid()
        self._listening.clear()
        self.listening_since = None
        self._stop = _Stop()
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="pikku-settle", daemon=True
        )
        self._thread.start()

    def _run(self, stop: _Stop) -> None:
        try:
            while not stop.is_set():
                try:
                    self._listen(stop)
                except Exception as exc:  # reconnect; waiters re-check meanwhile
                    self._listening.clear()
                    self.listening_since = None
                    if not stop.is_set():
                        log.info("settle listener reconnecting: %s", exc)
                    stop.wait(1.0)
        finally:
            with self._lock:
                if self._stop is None or self._stop is stop:  # no newer listener
                    self._listening.clear()
            stop.close()

    def _listen(self, stop: _Stop) -> None:
        fairy = self._engine.raw_connection()
        conn: Any = fairy.driver_connection  # psycopg: LISTEN needs autocommit
        # Made by the engine (so it follows where the engine points), but no
        # longer the pool's: it never goes back, and must not hold a slot the
        # application's own queries need.
        fairy.detach()
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {SETTLED_CHANNEL}")
            self.listening_since = time.monotonic()
            self._listening.set()
            self._wake_all()  # anything settled while we were not listening
            self._hear(conn, stop)
        finally:
            self.listening_since = None
            fairy.close()  # detached: this closes the connection itself

    def _hear(self, conn: Any, stop: _Stop) -> None:
        """Read notices until ``stop``: libpq's input, drained as it comes."""
        pgconn, encoding = conn.pgconn, conn.info.encoding
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(stop.reader, selectors.EVENT_READ)
            while not stop.is_set():
                while (note := pgconn.notifies()) is not None:
                    self._heard(note.extra.decode(encoding, "replace"))
                selector.select(self._idle_after)
                if stop.is_set() or self._retired_idle(stop):
                    return
                pgconn.consume_input()  # raises once the connection is gone

    def _retired_idle(self, stop: _Stop) -> bool:
        """Stop this thread when nobody has waited for ``idle_after`` seconds;
        decided under the lock, so a watch that comes now starts a new one."""
        with self._lock:
            if self._watchers:
                self._idle_since = None
                return False
            now = time.monotonic()
            if self._idle_since is None:
                self._idle_since = now
            if now - self._idle_since < self._idle_after:
                return False
            if self._stop is stop:
                self._thread = self._stop = None
            self._idle_since = None
        stop.set()
        return True

    def _heard(self, payload: str) -> None:
        run_id, outcome = read_notice(payload)
        with self._lock:
            if outcome is not None:
                self._recent[run_id] = outcome
                if len(self._recent) > RECENT_KEPT:
                    self._recent.popitem(last=False)
            events = list(self._watchers.get(run_id, ()))
        for event in events:
            event.set()

    def _wake_all(self) -> None:
        with self._lock:
            events = [e for waiting in self._watchers.values() for e in waiting]
        for event in events:
            event.set()


class _Stop:
    """A stop flag a selector can wait on beside the LISTEN connection."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reader, self._writer = socket.socketpair()

    def set(self) -> None:
        self._event.set()
        with suppress(OSError):  # already closed: the thread has ended
            self._writer.send(b"x")

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)

    def close(self) -> None:
        self.reader.close()
        self._writer.close()
