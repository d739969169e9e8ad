"""A kombu transport that keeps its messages in one SQLite file.

Why our own: kombu's ``filesystem://`` loses a message whose worker is
SIGKILLed and races when two consumers read one queue; ``sqla+sqlite://``
survives kills but never redelivers an unacked message, keeps every row and
rejects unknown transport options. This transport is a real queue:

* One row per message. A consumer *takes* the oldest visible row of a queue in
  one ``BEGIN IMMEDIATE`` transaction by pushing its ``visible_at`` to
  ``now + visibility_timeout`` under a fresh delivery tag, so exactly one
  consumer process gets it.
* ``ack`` deletes the row; ``reject(requeue=True)`` and a clean shutdown make
  it visible again at its original place.
* A consumer that dies without acking (SIGKILL, power cut of the worker) needs
  no cleanup: once ``visible_at`` passes, the row is simply visible again and
  the next poll of any consumer takes it. That is the visibility timeout, with
  the same meaning as on Redis and SQS.
* ``celery worker`` drives it from its event loop, so its prefork pool gives
  each process a job pipe of its own and survives any of them being killed,
  idle or busy (:mod:`pikku_celery.broker.polling` says why this matters).

Transport options (``broker_transport_options``; unknown ones are ignored):

``visibility_timeout`` (seconds, default 300)
    How long a taken, unacked message stays hidden. Celery holds ETA/countdown
    messages and prefetched messages unacked in memory, and ``acks_late`` tasks
    until they finish: all of these must stay below the visibility timeout, or
    the message is delivered a second time, exactly as on Redis.
``polling_interval`` (seconds, default 0.05)
    Sleep between empty polls; an empty poll is one indexed read, no lock.
``busy_timeout`` (seconds, default 30)
    How long a statement waits for SQLite's write lock before failing.
``synchronous`` (default ``"NORMAL"``)
    SQLite's ``PRAGMA synchronous``. With WAL, ``NORMAL`` survives any process
    crash; an OS crash or power loss may drop the last commits.

Limits: no broadcast (publishing to a fanout exchange raises
``NotImplementedError``, so ``celery inspect``/``control`` and ``revoke`` do
not work), no priorities (FIFO per queue), exchange bindings live in each
process as with kombu's other virtual transports (Celery declares its queues
before publishing, so tasks route fine), and visibility is judged on the
machine's wall clock, so the file must be on a local disk shared by processes
of one machine.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from queue import Empty
from typing import Any, NamedTuple

from kombu.transport import virtual
from kombu.transport.virtual.exchange import STANDARD_EXCHANGE_TYPES, FanoutExchange
from kombu.utils.json import dumps, loads

from .polling import EventLoopPoller

log = logging.getLogger(__name__)

TABLE = "pikku_broker_messages"

DEFAULT_VISIBILITY_TIMEOUT = 300.0
DEFAULT_POLLING_INTERVAL = 0.05
DEFAULT_BUSY_TIMEOUT = 30.0
DEFAULT_SYNCHRONOUS = "NORMAL"
SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})

SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {TABLE} (
        id INTEGER PRIMARY KEY,
        queue TEXT NOT NULL,
        payload TEXT NOT NULL,
        visible_at REAL NOT NULL,
        delivery_tag TEXT,
        deliveries INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {TABLE}_ready ON {TABLE} (queue, visible_at, id)",
)

_READY_ID = f"SELECT id FROM {TABLE} WHERE queue = ? AND visible_at <= ? LIMIT 1"
_OLDEST_READY = (
    f"SELECT id, payload, deliveries FROM {TABLE} "
    "WHERE queue = ? AND visible_at <= ? ORDER BY visible_at, id LIMIT 1"
)

# Connections inherited across fork() are never closed in the child (SQLite
# forbids using them there); keeping a reference stops the GC from closing them.
_INHERITED: list[sqlite3.Connection] = []


@dataclass(frozen=True)
class Options:
    """The transport options this transport reads, validated once."""

    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT
    polling_interval: float = DEFAULT_POLLING_INTERVAL
    busy_timeout: float = DEFAULT_BUSY_TIMEOUT
    synchronous: str = DEFAULT_SYNCHRONOUS

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any] | None) -> Options:
        """Read our keys from kombu's transport options; others belong to someone else."""
        opts = options or {}
        synchronous = str(opts.get("synchronous", DEFAULT_SYNCHRONOUS)).upper()
        if synchronous not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"transport option 'synchronous' must be one of {sorted(SYNCHRONOUS_MODES)}, "
                f"got {opts['synchronous']!r}"
            )
        return cls(
            visibility_timeout=_seconds(opts, "visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT),
            polling_interval=_seconds(
                opts, "polling_interval", DEFAULT_POLLING_INTERVAL, allow_zero=True
            ),
            busy_timeout=_seconds(opts, "busy_timeout", DEFAULT_BUSY_TIMEOUT, allow_zero=True),
            synchronous=synchronous,
        )


def _seconds(opts: Mapping[str, Any], key: str, default: float, allow_zero: bool = False) -> float:
    value = opts.get(key)
    if value is None:
        return default
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"transport option {key!r} must be a number of seconds, got {value!r}"
        ) from None
    if seconds != seconds or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"transport option {key!r} must be {bound} seconds, got {value!r}")
    return seconds


def database_path(hostname: str | None) -> str:
    """The SQLite file named by a broker URL, as an absolute path.

    Same convention as SQLAlchemy's ``sqlite://`` URLs: ``scheme:///rel.db`` is
    relative to the current directory (resolved now, so every later chdir is
    harmless), ``scheme:////abs/rel.db`` is absolute. A bare path is accepted
    for ``Connection(path, transport=...)``.
    """
    if not hostname or hostname == "localhost":
        raise ValueError(
            "the sqlite-queue transport needs a database file: "
            "sqlite-queue:///relative/broker.db or sqlite-queue:////absolute/broker.db"
        )
    path = hostname
    if "://" in hostname:
        _scheme, _, rest = hostname.partition("://")
        if not rest.startswith("/"):
            raise ValueError(
                f"{hostname!r} names a host, not a file: write three slashes for a relative "
                "path (sqlite-queue:///broker.db) and four for an absolute one "
                "(sqlite-queue:////tmp/broker.db)"
            )
        path = rest[1:]
    if not path or "?" in path or path == ":memory:":
        raise ValueError(
            f"{hostname!r}: expected a database file path (no query string, no :memory:; "
            "pass options as broker_transport_options)"
        )
    return os.path.abspath(os.path.expanduser(path))


class Taken(NamedTuple):
    """A message row a consumer has just taken."""

    id: int
    payload: str
    deliveries: int  # earlier deliveries of this row; > 0 means redelivered
    tag: str | None  # None when the row was deleted on take (no_ack)


def _row_id(delivery_tag: str) -> int | None:
    head, sep, _ = str(delivery_tag).partition(":")
    return int(head) if sep and head.isdigit() else None


class Database:
    """One SQLite connection, shared by the threads of one channel under a lock.

    Celery acks from its pool's result thread while the consumer thread polls,
    so the connection is not bound to a thread; the lock keeps transactions
    from interleaving.
    """

    def __init__(self, path: str, options: Options) -> None:
        self.path = path
        self.options = options
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()

    # -- connection ---------------------------------------------------------

    def _check_fork(self) -> None:
        if self._pid != os.getpid():
            # A forked child must not touch its parent's connection or lock.
            if self._conn is not None:
                _INHERITED.append(self._conn)
            self._conn = None
            self._lock = threading.RLock()
            self._pid = os.getpid()

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        self._check_fork()
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            yield self._conn

    def connect(self) -> None:
        """Open the file now, so a bad path fails at connect time."""
        with self._locked():
            pass

    def _open(self) -> sqlite3.Connection:
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self.options.busy_timeout,
            isolation_level=None,  # we issue BEGIN/COMMIT ourselves
            check_same_thread=False,
        )
        try:
            deadline = time.monotonic() + self.options.busy_timeout
            while True:
                try:
                    self._setup(conn)
                    break
                except sqlite3.OperationalError as exc:
                    # Switching a new file to WAL can report "locked" without
                    # waiting when several processes create it at once.
                    if "locked" not in str(exc) or time.monotonic() >= deadline:
                        raise
                    time.sleep(0.01)
        except BaseException:
            conn.close()
            raise
        return conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning("%s: SQLite refused WAL mode (got %r): expect it slower", self, mode)
        conn.execute(f"PRAGMA synchronous={self.options.synchronous}")
        for statement in SCHEMA:
            conn.execute(statement)

    def close(self) -> None:
        """Close the connection (reopened on next use)."""
        self._check_fork()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds SQLite's write lock from its start."""
        with self._locked() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def __repr__(self) -> str:
        return f"<sqlite-queue {self.path}>"

    # -- messages -----------------------------------------------------------

    def put(self, queue: str, payload: str) -> None:
        """Append a message to ``queue``, visible at once."""
        now = time.time()
        with self._locked() as conn:
            conn.execute(
                f"INSERT INTO {TABLE} (queue, payload, visible_at, created_at) VALUES (?, ?, ?, ?)",
                (queue, payload, now, now),
            )

    def take(self, queue: str, delete: bool = False) -> Taken | None:
        """Take the oldest visible message: hide it for the visibility timeout.

        With ``delete`` (a no_ack consumer) the row is removed instead, since
        no ack will ever come for it.
        """
        with self._locked() as conn:
            # Lock-free look first, so idle consumers never queue for the write lock.
            if _fetchone(conn, _READY_ID, (queue, time.time())) is None:
                return None
            with self._transaction():
                now = time.time()
                row = _fetchone(conn, _OLDEST_READY, (queue, now))
                if row is None:  # another consumer was faster
                    return None
                row_id, payload, deliveries = int(row[0]), str(row[1]), int(row[2])
                if delete:
                    conn.execute(f"DELETE FROM {TABLE} WHERE id = ?", (row_id,))
                    return Taken(row_id, payload, deliveries, None)
                tag = f"{row_id}:{uuid.uuid4().hex}"
                conn.execute(
                    f"UPDATE {TABLE} SET visible_at = ?, delivery_tag = ?, "
                    "deliveries = deliveries + 1 WHERE id = ?",
                    (now + self.options.visibility_timeout, tag, row_id),
                )
                return Taken(row_id, payload, deliveries, tag)

    def ack(self, delivery_tag: str) -> bool:
        """Delete the message if this tag still holds it; False if it was taken again."""
        row_id = _row_id(delivery_tag)
        if row_id is None:
            return False
        with self._locked() as conn:
            cursor = conn.execute(
                f"DELETE FROM {TABLE} WHERE id = ? AND delivery_tag = ?", (row_id, delivery_tag)
            )
            return cursor.rowcount == 1

    def requeue(self, delivery_tags: list[str]) -> int:
        """Make held messages visible now, back at their original place in the queue."""
        now = time.time()
        params = [(now, rid, tag) for tag in delivery_tags if (rid := _row_id(tag)) is not None]
        if not params:
            return 0
        with self._transaction() as conn:
            cursor = conn.executemany(
                f"UPDATE {TABLE} SET visible_at = MIN(created_at, ?), delivery_tag = NULL "
                "WHERE id = ? AND delivery_tag = ?",
                params,
            )
            return cursor.rowcount

    def size(self, queue: str) -> int:
        """Messages ready for delivery (not the ones held by consumers), as AMQP counts."""
        with self._locked() as conn:
            row = _fetchone(
                conn,
                f"SELECT COUNT(*) FROM {TABLE} WHERE queue = ? AND visible_at <= ?",
                (queue, time.time()),
            )
            return int(row[0]) if row else 0

    def purge(self, queue: str) -> int:
        """Delete the ready messages; held ones stay for their consumers to ack."""
        with self._locked() as conn:
            cursor = conn.execute(
                f"DELETE FROM {TABLE} WHERE queue = ? AND visible_at <= ?", (queue, time.time())
            )
            return cursor.rowcount

    def delete_queue(self, queue: str) -> int:
        """Delete every message of the queue, held or not."""
        with self._locked() as conn:
            return conn.execute(f"DELETE FROM {TABLE} WHERE queue = ?", (queue,)).rowcount


def _fetchone(
    conn: sqlite3.Connection, sql: str, params: tuple[Any, ...]
) -> tuple[Any, ...] | None:
    # Closing the cursor at once ends its implicit read transaction.
    cursor = conn.execute(sql, params)
    try:
        row: tuple[Any, ...] | None = cursor.fetchone()
        return row
    finally:
        cursor.close()


class BroadcastUnsupported(FanoutExchange):
    """Fanout exchanges can be declared and bound (Celery's workers do), not published to.

    Failing loudly beats kombu's default of silently dropping the message.
    """

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        """Refuse fanout: this broker has no broadcast, so say which brokers do."""
        raise NotImplementedError(
            f"the sqlite-queue broker has no broadcast (fanout exchange {exchange!r}): "
            "celery inspect/control and revoke need Redis or RabbitMQ"
        )


class QoS(virtual.QoS):
    """Acks and rejects go to the database, not to an in-memory copy of the message."""

    def ack(self, delivery_tag: str) -> None:
        """Delete the message's row; a tag whose visibility timeout passed is logged."""
        # Tags we did not issue (no_ack deliveries) have no row to delete.
        if _row_id(delivery_tag) is not None and not self.channel.db.ack(delivery_tag):
            log.warning(
                "ack of %s found no message held by that tag: its visibility timeout "
                "(%.1f s) had passed, so it was or will be delivered again (or it was purged)",
                delivery_tag,
                self.channel.db.options.visibility_timeout,
            )
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        """Give the message back to its queue (``requeue``) or drop it."""
        if requeue:
            self.channel.db.requeue([delivery_tag])
        else:
            self.channel.db.ack(delivery_tag)
        super().ack(delivery_tag)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back the messages this channel holds (clean shutdown)."""
        self._flush()
        tags = [str(tag) for tag in self._delivered]
        self._delivered.clear()
        try:
            self.channel.db.requeue(tags)
        except Exception as exc:
            # Nothing is lost: the rows come back when their visibility ends.
            log.warning(
                "could not give back %d unacked message(s) now (%s); "
                "they are redelivered after the visibility timeout",
                len(tags),
                exc,
            )
        return []


class Channel(virtual.Channel):
    """A virtual channel whose queues are rows of one SQLite table."""

    QoS = QoS
    supports_fanout = False
    exchange_types = dict(STANDARD_EXCHANGE_TYPES, fanout=BroadcastUnsupported)

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        self.db = Database(connection.database_path, connection.options)
        self.db.connect()  # before kombu allocates a channel id we would leak
        # Queues consumed with no_ack: a take deletes the row, no ack will come.
        self._noack_queues: set[str] = set()
        super().__init__(connection, **kwargs)

    # -- kombu's virtual channel API ---------------------------------------

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        taken = self.db.take(queue, delete=queue in self._noack_queues)
        if taken is None:
            raise Empty()
        return self._payload(taken)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self.db.put(queue, dumps(message))

    def _size(self, queue: str) -> int:
        return self.db.size(queue)

    def _purge(self, queue: str) -> int:
        return self.db.purge(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self.db.delete_queue(queue)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        """Nothing to create: a queue is the set of rows carrying its name."""

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def _restore(self, message: Any) -> None:
        """Make the held row visible again instead of publishing a copy."""
        self.db.requeue([message.delivery_tag])

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        """Delete the rows even when this process never bound the queue."""
        if if_empty and self._size(queue):
            return
        self.state.queue_bindings_delete(queue)
        self._delete(queue)

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        """Consume ``queue``, remembering whether its deliveries need an ack."""
        if no_ack:
            self._noack_queues.add(queue)
        else:
            self._noack_queues.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Stop consuming; the queue's no-ack mark goes with its last consumer."""
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._tag_to_queue.values():
            self._noack_queues.discard(queue)
        return result

    def wants_messages(self) -> bool:
        """True when this channel consumes a queue and its prefetch has room."""
        return bool(self._consumers) and bool(self.qos.can_consume())

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        """Take one message: deleted with ``no_ack``, else hidden until acked."""
        taken = self.db.take(queue, delete=no_ack)
        if taken is None:
            return None
        message = self.Message(self._payload(taken), channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def close(self) -> None:
        """Give back unacked messages, then close the database connection."""
        try:
            super().close()  # gives back unacked messages first
        finally:
            self.db.close()

    # -- helpers -------------------------------------------------------------

    @staticmethod
    def _payload(taken: Taken) -> dict[str, Any]:
        payload: dict[str, Any] = loads(taken.payload)
        properties = payload.setdefault("properties", {})
        if taken.tag is not None:
            properties["delivery_tag"] = taken.tag
        if taken.deliveries:
            properties.setdefault("delivery_info", {})["redelivered"] = True
            headers = payload.get("headers")
            if isinstance(headers, dict):
                headers["redelivered"] = True
        return payload


class Transport(virtual.Transport):
    """kombu transport for ``sqlite-queue:///path/to/broker.db``.

    Event-loop capable, so that ``celery worker``'s prefork pool gives each
    process a job pipe of its own and survives killed processes, idle or
    busy (see :mod:`.polling` for why and how).
    """

    Channel = Channel
    implements = virtual.Transport.implements.extend(asynchronous=True)

    can_parse_url = True  # kombu hands us the whole URL as the hostname
    driver_type = "sqlite"  # not amqp/redis: Celery skips gossip and mingle
    driver_name = "sqlite3"
    polling_interval = DEFAULT_POLLING_INTERVAL
    # "database is locked" past busy_timeout: kombu/Celery retry and reconnect.
    connection_errors = (  # type: ignore[assignment]  # kombu infers tuple[Any]
        *virtual.Transport.connection_errors,
        sqlite3.OperationalError,
    )

    def __init__(self, client: Any, **kwargs: Any) -> None:
        self.options = Options.from_transport_options(client.transport_options)
        self.database_path = database_path(client.hostname)
        super().__init__(client, **kwargs)
        self.polling_interval = self.options.polling_interval
        #: What feeds the consumers when a kombu event loop drives this transport.
        self.poller = EventLoopPoller(self)

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Poll the database from the worker's event loop (see :mod:`.polling`)."""
        self.poller.attach(loop, self.polling_interval or 0.0)

    def close_connection(self, connection: Any) -> None:
        """Stop polling from the event loop, then close the channels."""
        self.poller.detach()
        super().close_connection(connection)

    def driver_version(self) -> str:
        """The SQLite library's version, which kombu reports as the driver's."""
        return sqlite3.sqlite_version
