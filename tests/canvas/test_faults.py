"""Durable canvas under faults: workers SIGKILLed, the broker flushed.

Each node is a step, so a killed worker's node is taken over once its lease
lapses, and a lost message is re-sent by the beat sweep; ledger rows written
in each node's transaction show every node's effect happened exactly once.
"""

from __future__ import annotations

import pytest
import redis
from celery import chain, chord

from pikku_celery.store import AttemptStatus
from tests.helpers import wait_until
from tests.services import SESSION_TAG

from .cluster import CanvasCluster

pytestmark = pytest.mark.slow


def test_a_worker_killed_in_a_chord_header_member_runs_the_body_once(
    canvas_cluster: CanvasCluster,
) -> None:
    c = canvas_cluster
    app = c.app.app
    hang_key, body_key = f"hdr-{SESSION_TAG}", f"body-{SESSION_TAG}"
    header = [
        app.signature("c.hang_first", args=("a", hang_key)),
        app.signature("c.add", args=(1, 1)),
        app.signature("c.add", args=(2, 2)),
    ]
    run = c.app.pikku.durable(chord(header, app.signature("c.ledger", args=(body_key,))))
    wait_until((c.workdir / f"{hang_key}.pid").exists, timeout=30)
    c.add_worker()  # ready before the kill: the takeover waits only for the lease
    c.workers[0].kill()
    try:
        assert run.wait(timeout=60) == ["a", 2, 4]
    except Exception:
        print(c.logs())
        raise
    assert c.ledger_rows(body_key) == 1  # the body ran exactly once
    history = {h.step.name: h for h in run.steps()}
    assert [a.status for a in history["canvas.h0"].attempts] == [
        AttemptStatus.SUPERSEDED,
        AttemptStatus.SUCCEEDED,
    ]
    assert [a.status for a in history["canvas.body"].attempts] == [AttemptStatus.SUCCEEDED]


def test_chains_complete_after_the_broker_is_flushed(canvas_cluster: CanvasCluster) -> None:
    c = canvas_cluster
    app = c.app.app
    c.add_worker()

    def link(i: int, k: int) -> object:
        return app.signature("c.ledger", args=(f"flush-{SESSION_TAG}-{i}-{k}",))

    runs = [
        c.app.pikku.durable(
            chain(app.signature("c.add", args=(i, 0)), *[link(i, k) for k in range(4)])
        )
        for i in range(20)
    ]
    wait_until(lambda: any(len(r.steps()) > 1 for r in runs), timeout=30)
    redis.Redis.from_url(c.env["PIKKU_T_BROKER"]).flushdb()
    for i, r in enumerate(runs):
        try:
            assert r.wait(timeout=120) == i
        except Exception:
            print(c.logs())
            raise
    for i in range(20):
        assert [c.ledger_rows(f"flush-{SESSION_TAG}-{i}-{k}") for k in range(4)] == [1, 1, 1, 1]


def test_a_worker_killed_between_links_completes_the_chain_each_link_once(
    canvas_cluster: CanvasCluster,
) -> None:
    c = canvas_cluster
    app = c.app.app
    keys = [f"link-{SESSION_TAG}-{k}" for k in range(5)]
    run = c.app.pikku.durable(
        chain(
            app.signature("c.ledger", args=("v", keys[0])),
            *[app.signature("c.ledger", args=(key,)) for key in keys[1:]],
        )
    )
    c.add_worker()
    wait_until(lambda: c.ledger_rows(keys[1]) == 1, timeout=30, interval=0.001)
    c.workers[0].kill()  # somewhere after link 1 committed: recording, sending or running link 2
    try:
        assert run.wait(timeout=60) == "v"
    except Exception:
        print(c.logs())
        raise
    assert [c.ledger_rows(key) for key in keys] == [1, 1, 1, 1, 1]
    for h in run.steps():
        assert [a.status for a in h.attempts][-1] == AttemptStatus.SUCCEEDED
