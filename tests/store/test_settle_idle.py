"""The settle listener lets its LISTEN connection go when nobody waits, and
listens again for the next waiter: a process that waits now and then holds no
connection between its waits (PostgreSQL)."""

from __future__ import annotations

import time
import uuid

import sqlalchemy as sa

from pikku_celery.sql.settle import SETTLED_CHANNEL, SettleListener
from tests.helpers import wait_until
from tests.services import SUITE_APP_NAME

IDLE = 0.3


def listening_backends(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                "AND query LIKE 'LISTEN%'"
            ),
            {"app": SUITE_APP_NAME},
        )
        return int(found.scalar_one())


def notify(engine: sa.Engine, run_id: str) -> None:
    with engine.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_notify(:channel, :id)"), {"channel": SETTLED_CHANNEL, "id": run_id}
        )
        conn.commit()


def test_an_idle_listener_lets_its_connection_go_and_the_next_waiter_is_heard(
    postgres_engine: sa.Engine,
) -> None:
    before = listening_backends(postgres_engine)
    listener = SettleListener(postgres_engine, idle_after=IDLE)
    try:
        with listener.watch(str(uuid.uuid4())):
            assert listener.running
            assert listening_backends(postgres_engine) == before + 1
        wait_until(lambda: not listener.running, timeout=10)
        wait_until(lambda: listening_backends(postgres_engine) == before, timeout=10)

        run_id = str(uuid.uuid4())
        with listener.watch(run_id) as watch:  # listens again before it returns
            assert listener.running
            notify(postgres_engine, run_id)
            assert watch.event.wait(10)
    finally:
        listener.close()
    # The server ends a backend shortly after its client hangs up.
    wait_until(lambda: listening_backends(postgres_engine) == before, timeout=10)


def test_a_listener_with_a_waiter_keeps_listening(postgres_engine: sa.Engine) -> None:
    listener = SettleListener(postgres_engine, idle_after=IDLE)
    try:
        with listener.watch(str(uuid.uuid4())):
            deadline = time.monotonic() + 5 * IDLE
            while time.monotonic() < deadline:  # several idle periods pass
                assert listener.running
                time.sleep(IDLE / 3)  # the interval between checks, not synchronisation
    finally:
        listener.close()
