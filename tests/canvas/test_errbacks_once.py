"""Errbacks run once per failure, even when their message is delivered again.

Each errback is a step: a second delivery of its message (a redelivery after
a visibility timeout, a duplicate publish) finds the step settled and runs
nothing. A chord inside a group body whose header failed calls the errbacks
of that chord's body, once, as Celery does.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import chord, group

from tests.helpers import wait_until

from .cluster import CanvasCluster


def test_a_redelivered_errback_message_runs_nothing_again(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    tag = f"once-{uuid.uuid4()}"
    fail = app.signature("c.boom", args=(1,))
    fail.link_error(app.signature("c.record_errback_id", kwargs={"tag": tag}))
    run = c.app.pikku.durable(fail)
    with pytest.raises(ValueError):
        run.wait(timeout=30)
    (errback,) = [h.step for h in run.steps() if h.step.name == "canvas.err0"]
    for _ in range(3):
        c.app.pikku.dispatcher.send_step(errback)  # delivered again, three times
    broker = redis.Redis.from_url(c.env["PIKKU_T_BROKER"])

    def drained() -> bool:
        return all(broker.llen(q) == 0 for q in c.app.queues) and not broker.hlen("unacked")

    wait_until(drained, timeout=20)
    assert len(c.recorded(tag)) == 1
    (history,) = [h for h in run.steps() if h.step.name == "canvas.err0"]
    assert len(history.attempts) == 1


def test_a_chord_in_a_group_body_calls_its_bodys_errbacks_once_when_the_header_fails(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    tag = f"chord-body-{uuid.uuid4()}"
    errback = app.signature("c.record", args=("errback", tag), immutable=True)
    inner = chord([app.signature("c.add", args=(2, 2))], app.signature("c.tsum"))
    canvas = chord(
        [app.signature("c.add", args=(1, 1)), app.signature("c.boom", args=(3,))],
        group(inner, app.signature("c.tsum")),
    )
    canvas.link_error(errback)
    with pytest.raises(ValueError):
        c.app.pikku.durable(canvas).wait(timeout=30)
    assert c.recorded(tag) == ["errback", "errback"]  # the inner chord's body's, tsum's
