"""The SQLite transport through kombu: delivery, acks, visibility timeout, races."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.asynchronous import Hub
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message
from kombu.messaging import Consumer, Producer

import pikku_celery.broker
from pikku_celery.broker.sqlite import TABLE, Options, Transport, database_path
from tests.helpers import wait_until

EXCHANGE = Exchange("jobs", type="direct")
JOBS = Queue("jobs", EXCHANGE, routing_key="jobs")


def url_for(path: Path) -> str:
    return f"sqlite-queue:///{path}"  # path is absolute: four slashes


def rows(path: Path, where: str = "1 = 1") -> list[tuple[Any, ...]]:
    """Message rows as seen by an outside connection."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(
            f"SELECT id, queue, delivery_tag, deliveries FROM {TABLE} WHERE {where} ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "broker.db"


@pytest.fixture
def conn(db: Path) -> Iterator[Connection]:
    with Connection(url_for(db), transport_options={"polling_interval": 0.01}) as c:
        yield c


def publish(conn: Connection, *bodies: Any, queue: Queue = JOBS) -> None:
    producer = Producer(conn.default_channel)
    for body in bodies:
        producer.publish(
            body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue]
        )


def get(conn: Connection, queue: str = "jobs", no_ack: bool = False) -> Message | None:
    message: Message | None = conn.default_channel.basic_get(queue, no_ack=no_ack)
    return message


# -- URLs and options -------------------------------------------------------


def test_registers_the_url_scheme() -> None:
    from kombu.transport import TRANSPORT_ALIASES, resolve_transport

    assert TRANSPORT_ALIASES["sqlite-queue"] == pikku_celery.broker.TRANSPORT
    assert resolve_transport("sqlite-queue") is Transport


def test_url_paths_follow_sqlalchemy_slashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert database_path("sqlite-queue:////var/q/broker.db") == "/var/q/broker.db"
    assert database_path("sqlite-queue:///broker.db") == str(tmp_path / "broker.db")
    assert database_path("sqlite-queue:///sub/b.db") == str(tmp_path / "sub" / "b.db")
    assert database_path("/abs/b.db") == "/abs/b.db"  # bare path with transport=...
    for bad in ("sqlite-queue://broker.db", "sqlite-queue:///", "sqlite-queue:///b.db?x=1", None):
        with pytest.raises(ValueError):
            database_path(bad)


def test_kombu_hands_the_whole_url_to_the_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Connection("sqlite-queue:///rel/broker.db") as c:
        assert c.transport.database_path == str(tmp_path / "rel" / "broker.db")
    with Connection(f"sqlite-queue:///{tmp_path}/abs.db") as c:
        assert c.transport.database_path == str(tmp_path / "abs.db")
        c.connect()
    assert (tmp_path / "abs.db").exists()
    # Named by import path instead of the alias.
    with Connection("sqlite-queue:///x.db", transport=pikku_celery.broker.TRANSPORT) as c:
        assert c.transport.database_path == str(tmp_path / "x.db")


def test_unknown_options_are_ignored_and_bad_values_refused(db: Path) -> None:
    options = {"visibility_timeout": "7", "queue_order_strategy": "x", "anything": object()}
    with Connection(url_for(db), transport_options=options) as c:
        assert c.transport.options.visibility_timeout == 7.0
        assert c.transport.polling_interval == Options().polling_interval
        publish(c, "hello")
        message = get(c)
        assert message is not None and message.payload == "hello"
    for bad in ({"visibility_timeout": 0}, {"polling_interval": "soon"}, {"synchronous": "x"}):
        with pytest.raises(ValueError):
            Options.from_transport_options(bad)


# -- delivery ---------------------------------------------------------------


def test_publish_consume_ack_leaves_an_empty_table(conn: Connection, db: Path) -> None:
    received: list[Any] = []

    def on_message(body: Any, message: Message) -> None:
        received.append(body)
        message.ack()

    publish(conn, {"n": 1}, {"n": 2}, b"raw bytes")
    with Consumer(conn, queues=[JOBS], callbacks=[on_message]):
        wait_until(lambda: conn.drain_events(timeout=1) or len(received) == 3, timeout=10)
    assert received == [{"n": 1}, {"n": 2}, b"raw bytes"]  # FIFO
    assert rows(db) == []


def test_an_event_loop_is_fed_by_polling_within_the_consumers_prefetch(
    conn: Connection, db: Path
) -> None:
    # Celery runs its event loop (and the prefork pool with a job pipe per
    # process) only for a transport that says it can be driven by one.
    assert conn.is_evented
    received: list[Message] = []
    publish(conn, *range(5))
    hub = Hub()
    try:
        conn.register_with_event_loop(hub)
        consumer = Consumer(conn, queues=[JOBS], callbacks=[lambda _b, m: received.append(m)])
        consumer.qos(prefetch_count=2)
        consumer.consume()
        loop = hub.create_loop()
        wait_until(lambda: next(loop) or len(received) == 2, timeout=10)
        assert conn.transport.poller.deliver_ready() == 0  # prefetch full: nothing more taken
        assert len(rows(db, "delivery_tag IS NOT NULL")) == 2
        for message in received:
            message.ack()
        wait_until(lambda: next(loop) or len(received) == 4, timeout=10)
        received[2].ack()
        received[3].ack()
        wait_until(lambda: next(loop) or len(received) == 5, timeout=10)
        received[4].ack()
        assert [m.payload for m in received] == [0, 1, 2, 3, 4]
        assert rows(db) == []
    finally:
        hub.close()


def test_a_taken_message_is_hidden_and_ack_deletes_it(conn: Connection, db: Path) -> None:
    publish(conn, "one")
    message = get(conn)
    assert message is not None
    (row,) = rows(db)
    assert row[2] == message.delivery_tag and row[3] == 1  # held by this tag
    assert get(conn) is None
    assert conn.default_channel.queue_declare("jobs", passive=True).message_count == 0
    message.ack()
    assert rows(db) == []


def test_no_ack_consumers_delete_on_take(conn: Connection, db: Path) -> None:
    publish(conn, "fire and forget")
    message = get(conn, no_ack=True)
    assert message is not None and message.payload == "fire and forget"
    assert rows(db) == []


def test_reject_requeues_at_the_front_or_deletes(conn: Connection, db: Path) -> None:
    publish(conn, "first", "second")
    first = get(conn)
    assert first is not None and first.payload == "first"
    first.reject(requeue=True)
    again = get(conn)
    assert again is not None and again.payload == "first"  # back at its place
    assert again.delivery_info["redelivered"] is True
    again.reject(requeue=False)
    second = get(conn)
    assert second is not None and second.payload == "second"
    second.ack()
    assert rows(db) == []


def test_closing_the_channel_gives_back_unacked_messages(db: Path) -> None:
    with Connection(url_for(db)) as first:
        publish(first, "held")
        assert get(first) is not None
    with Connection(url_for(db)) as second:
        message = get(second)  # at once, not after the visibility timeout
        assert message is not None and message.payload == "held"
        message.ack()
    assert rows(db) == []


def test_size_purge_and_delete(conn: Connection, db: Path) -> None:
    publish(conn, 1, 2, 3)
    held = get(conn)
    assert held is not None
    channel = conn.default_channel
    assert channel.queue_declare("jobs").message_count == 2  # ready ones only
    assert channel.queue_purge("jobs") == 2
    assert len(rows(db)) == 1  # the held message stays for its consumer
    held.ack()
    publish(conn, 4, 5)
    channel.queue_delete("jobs")
    assert rows(db) == []


def test_broadcast_fails_loudly(conn: Connection) -> None:
    fanout = Exchange("news", type="fanout")
    queue = Queue("news-1", fanout)
    queue(conn.default_channel).declare()  # declaring and binding is fine
    with pytest.raises(NotImplementedError, match="broadcast"):
        Producer(conn.default_channel).publish("hi", exchange=fanout)


# -- visibility timeout -----------------------------------------------------


def test_an_unacked_message_comes_back_after_the_visibility_timeout_not_before(
    db: Path,
) -> None:
    visibility = 1.5
    options = {"visibility_timeout": visibility}
    with (
        Connection(url_for(db), transport_options=options) as a,
        Connection(url_for(db), transport_options=options) as b,
    ):
        publish(a, "job")
        before_take = time.time()  # the row's visible_at is at least this + visibility
        taken = get(a)
        assert taken is not None
        # Consumer a "dies": it never acks. Until the timeout, b must see nothing.
        seen_early = []
        while time.time() < before_take + visibility - 0.3:
            message = get(b)
            if message is not None:
                seen_early.append(message.payload)
            time.sleep(0.02)  # poll rate of this observation, not a synchronisation
        assert seen_early == []
        again = wait_until(lambda: get(b), timeout=visibility + 5)
        assert again is not None
        assert time.time() - before_take >= visibility
        assert again.payload == "job"
        assert again.delivery_info["redelivered"] is True
        assert again.delivery_tag != taken.delivery_tag
        # a's late ack must not delete the message b now holds.
        taken.ack()
        (row,) = rows(db)
        assert row[2] == again.delivery_tag and row[3] == 2
        again.ack()
        assert rows(db) == []


# -- several consumer processes ---------------------------------------------


def consume_into(url: str, out: str, ready: Any, stop: Any) -> None:
    """Child process: ack every message of ``jobs`` and log its body to ``out``."""
    with (
        Connection(url, transport_options={"polling_interval": 0.005}) as conn,
        open(out, "a", buffering=1) as log,
    ):

        def on_message(body: Any, message: Message) -> None:
            log.write(f"{body}\n")
            message.ack()

        with Consumer(conn, queues=[JOBS], callbacks=[on_message], prefetch_count=5):
            ready.set()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=0.1)


def test_two_consumer_processes_get_each_message_exactly_once(tmp_path: Path, db: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    outs = [tmp_path / f"consumer-{i}.log" for i in range(2)]
    readies = [ctx.Event() for _ in outs]
    procs = [
        ctx.Process(target=consume_into, args=(url_for(db), str(out), ready, stop))
        for out, ready in zip(outs, readies, strict=True)
    ]
    try:
        for p in procs:
            p.start()
        for ready in readies:
            assert ready.wait(30), "consumer did not start"
        with Connection(url_for(db)) as conn:
            publish(conn, *range(200))

        def consumed() -> list[int]:
            return [int(line) for out in outs if out.exists() for line in out.read_text().split()]

        wait_until(lambda: len(consumed()) >= 200 and not rows(db), timeout=60)
        stop.set()
        for p in procs:
            p.join(10)
            assert p.exitcode == 0
        per_process = [len(out.read_text().split()) for out in outs]
        assert sorted(consumed()) == list(range(200)), "a message was lost or duplicated"
        assert all(n > 0 for n in per_process), f"no race happened: {per_process}"
        assert rows(db) == []
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)


def test_a_forked_child_opens_its_own_connection(conn: Connection, db: Path) -> None:
    publish(conn, "before fork")
    channel = conn.default_channel
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's sqlite handle
        code = 1
        try:
            message = channel.basic_get("jobs")
            if message is not None and message.payload == "before fork":
                message.ack()
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert rows(db) == []
    publish(conn, "after fork")  # the parent's connection still works
    message = get(conn)
    assert message is not None and message.payload == "after fork"
    message.ack()
