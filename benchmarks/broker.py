"""Throughput of the embedded SQLite broker against kombu's ``sqla+sqlite://``.

Run from the project root::

    .venv/bin/python benchmarks/broker.py [--messages 1000] [--tasks 300]

Prints, per transport: publishes/s, consume+ack/s, sequential publish→consume→ack
round trips/s (kombu level), and Celery tasks/s end to end through a real
``celery worker`` (prefork, 2 processes). Both transports poll every 0.05 s; kombu's
SQLAlchemy transport rejects a ``polling_interval`` option, so the worker sets its
class attribute instead. No targets: the numbers are for comparison in one run.

This file is also the ``-A`` module of the benchmark's worker (``BENCH_BROKER_URL``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from celery import Celery
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.message import Message
from kombu.messaging import Consumer, Producer

ROOT = Path(__file__).resolve().parents[1]
CELERY = str(Path(sys.executable).with_name("celery"))
WORKER_ARGS = ("--pool", "prefork", "-c", "2", "-Q", "bench", "-l", "warning")
sys.path.insert(0, str(ROOT))

import pikku_celery.broker  # noqa: E402, F401  (registers sqlite-queue://)

POLLING_INTERVAL = 0.05
BENCH_QUEUE = "bench"
BODY = {"task": "bench.noop", "args": [1, 2, 3], "kwargs": {"order": 7, "skus": ["a", "b"]}}


def transport_options(url: str) -> dict[str, Any]:
    """kombu's sqla transport passes its options to create_engine: give it none."""
    if not url.startswith("sqlite-queue"):
        return {}
    synchronous = os.environ.get("BENCH_SYNCHRONOUS", "NORMAL")
    return {"polling_interval": POLLING_INTERVAL, "synchronous": synchronous}


def _worker_app() -> Celery:
    url = os.environ.get("BENCH_BROKER_URL", "sqlite-queue:///bench-broker.db")
    if url.startswith("sqla"):
        from kombu.transport.sqlalchemy import Transport as SqlaTransport

        SqlaTransport.polling_interval = POLLING_INTERVAL
    celery_app = Celery("bench", broker=url)
    celery_app.conf.update(
        broker_transport_options=transport_options(url),
        broker_connection_retry_on_startup=True,
        task_default_queue=BENCH_QUEUE,
        task_acks_late=True,
        worker_hijack_root_logger=False,
    )

    @celery_app.task(name="bench.done")  # type: ignore[untyped-decorator]
    def done(path: str) -> None:
        with open(path, "a") as f:
            f.write("x")

    return celery_app


app = _worker_app()


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:9.0f}/s"


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def kombu_numbers(url: str, messages: int) -> dict[str, str]:
    exchange = Exchange("bench", type="direct")
    queue = Queue("bench", exchange, routing_key="bench")
    with Connection(url, transport_options=transport_options(url)) as conn:
        channel = conn.default_channel
        if url.startswith("sqla"):
            conn.transport.polling_interval = POLLING_INTERVAL
        producer = Producer(channel, exchange=exchange, routing_key="bench")
        queue(channel).declare()

        def publish_all() -> None:
            for _ in range(messages):
                producer.publish(BODY)

        received = [0]

        def on_message(_body: Any, message: Message) -> None:
            received[0] += 1
            message.ack()

        def drain(until: int) -> None:
            deadline = time.monotonic() + 120
            while received[0] < until and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):
                    conn.drain_events(timeout=1)

        publish_s = timed(publish_all)
        with Consumer(channel, queues=[queue], callbacks=[on_message], prefetch_count=10):
            consume_s = timed(lambda: drain(messages))
            rounds = max(messages // 4, 1)

            def round_trips() -> None:
                for i in range(rounds):
                    producer.publish(BODY)
                    drain(messages + i + 1)

            round_s = timed(round_trips)
        assert received[0] == messages + rounds, received
    return {
        "publish": rate(messages, publish_s),
        "consume+ack": rate(messages, consume_s),
        "round trip": rate(rounds, round_s),
    }


@contextlib.contextmanager
def celery_worker(url: str, workdir: Path) -> Iterator[None]:
    env = dict(os.environ, BENCH_BROKER_URL=url, PYTHONPATH=str(ROOT))
    with (workdir / "worker.log").open("wb") as log:
        proc = subprocess.Popen(
            [CELERY, "-A", "broker:app", "worker", *WORKER_ARGS],
            cwd=Path(__file__).parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_for_size(path: Path, size: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.stat().st_size >= size):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path}: fewer than {size} tasks done in {timeout} s")
        time.sleep(0.005)


def celery_numbers(url: str, tasks: int, workdir: Path) -> dict[str, str]:
    done = workdir / "done"
    publisher = Celery("bench-publisher", broker=url)
    publisher.conf.update(
        broker_transport_options=transport_options(url), task_default_queue=BENCH_QUEUE
    )
    with celery_worker(url, workdir):
        publisher.send_task("bench.done", args=[str(done)])  # warm-up: worker is up
        wait_for_size(done, 1, timeout=60)
        start = time.perf_counter()
        for _ in range(tasks):
            publisher.send_task("bench.done", args=[str(done)])
        wait_for_size(done, tasks + 1, timeout=300)
        elapsed = time.perf_counter() - start
    publisher.close()
    return {"celery tasks": rate(tasks, elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument(
        "--synchronous",
        default="NORMAL",
        help="PRAGMA synchronous of sqlite-queue (FULL: fsync every commit, as sqla does)",
    )
    args = parser.parse_args()
    os.environ["BENCH_SYNCHRONOUS"] = args.synchronous  # read by worker subprocesses too
    results: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="pikku-bench-") as tmp:
        for name, scheme in (
            ("sqlite-queue", "sqlite-queue:///"),
            ("sqla+sqlite", "sqla+sqlite:///"),
        ):
            for kind in ("kombu", "celery"):
                workdir = Path(tmp) / f"{name}-{kind}"
                workdir.mkdir()
                url = f"{scheme}{workdir / 'broker.db'}"
                if kind == "kombu":
                    numbers = kombu_numbers(url, args.messages)
                else:
                    numbers = celery_numbers(url, args.tasks, workdir)
                results.setdefault(name, {}).update(numbers)
                print(f"{name:13} {kind:6} {numbers}", file=sys.stderr, flush=True)
    metrics = list(next(iter(results.values())))
    print(f"\n{'':14}" + "".join(f"{m:>15}" for m in metrics))
    for name, numbers in results.items():
        print(f"{name:14}" + "".join(f"{numbers[m]:>15}" for m in metrics))
    print(
        f"\n{args.messages} messages, {args.tasks} Celery tasks (prefork -c 2, acks_late), "
        f"polling {POLLING_INTERVAL} s, sqlite-queue synchronous={args.synchronous}, "
        f"SQLite {sqlite3.sqlite_version}"
    )


if __name__ == "__main__":
    main()
