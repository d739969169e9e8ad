"""A step message whose claim meets a long outage is sent again, not lost.

Celery's in-process worker takes the step's message while the database is
out of reach (the line to it cut). The claim waits out the outage in place
for the app's ``outage_timeout``, then the message is published again with
a countdown, round after round, until the store is back; the run then
completes. No sweep runs: a message lost here would stay lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from pikku_celery import Context, Pikku
from tests.helpers import memory_broker_config, wait_until
from tests.lease.tcp_proxy import TcpProxy

from .support import through

OUTAGE = 2.5
"""Longer than the app's ``outage_timeout``: the message goes round again."""


@pytest.fixture(autouse=True)
def root_level_kept() -> Iterator[None]:
    """Celery's test worker sets the root logger's level (to ERROR): put it
    back, or later tests' log captures miss their warnings."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture
def celery_config() -> dict[str, Any]:
    return memory_broker_config()


@pytest.fixture
def celery_worker_parameters() -> dict[str, Any]:
    return {"queues": ("celery",), "perform_ping_check": False}


@pytest.fixture
def pikku(celery_app: Celery, proxy: TcpProxy, outage_database: str) -> Iterator[Pikku]:
    made = Pikku(
        celery_app,
        through(proxy, outage_database),
        install_beat=False,
        outage_timeout=0.3,
        message_grace=3600,
        queue_leases={"celery": 30},
    )
    yield made
    assert made.sql_engine is not None
    made.sql_engine.dispose()


def test_a_claim_that_outlasts_the_wait_is_sent_again_until_the_store_is_back(
    celery_app: Celery,
    pikku: Pikku,
    proxy: TcpProxy,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="pikku_celery")

    @celery_app.task(name="redeliver.double", shared=False)
    def double(n: int) -> int:
        return 2 * n

    @pikku.workflow(name="redeliver.flow")
    def flow(ctx: Context, n: int) -> Any:
        return ctx.step("double", double, n)

    run = flow.start(21)  # its step's message waits in the queue: no worker yet
    proxy.cut()
    restore = threading.Timer(OUTAGE, proxy.restore)
    restore.start()
    request.getfixturevalue("celery_worker")
    wait_until(lambda: "the message is sent again" in caplog.text, timeout=30)
    restore.join()
    assert run.wait(timeout=30) == 42
