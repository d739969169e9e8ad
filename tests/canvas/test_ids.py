"""Ids the caller chose (``freeze()``, ``task_id=``) answer ``AsyncResult(id)``, on a real worker.

Each canvas node's outcome is written to the app's result backend under its
id once the node settles, and the task sees that id as ``self.request.id``.
"""

from __future__ import annotations

import uuid

import pytest
from celery import chain, group
from celery.result import AsyncResult

from tests.helpers import wait_until

from .cluster import CanvasCluster


def test_frozen_ids_are_the_nodes_result_ids(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    first = app.signature("c.add", args=(1, 2))
    first_id = first.freeze().id
    last_id = str(uuid.uuid4())
    canvas = chain(first, app.signature("c.mul", args=(10,)).set(task_id=last_id))
    result = c.app.pikku.durable(canvas).async_result()
    assert result.id == last_id  # as chain(...).apply_async().id: the last task's
    assert result.get(timeout=30) == 30
    assert result.state == "SUCCESS" and result.ready() and result.successful()
    assert AsyncResult(first_id, app=app).get(timeout=10) == 3
    assert AsyncResult(last_id, app=app).get(timeout=10) == 30


def test_a_failed_nodes_id_holds_its_exception(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    fail = app.signature("c.boom", args=(1,))
    fail_id = fail.freeze().id
    result = c.app.pikku.durable(group(app.signature("c.add", args=(1, 1)), fail)).async_result()
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=30)
    assert result.failed() and result.state == "FAILURE"
    found = AsyncResult(fail_id, app=app)
    with pytest.raises(ValueError, match="boom"):
        found.get(timeout=10)
    assert found.state == "FAILURE"


def test_the_task_sees_its_frozen_id_and_errbacks_get_it(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    tag = f"ids-{uuid.uuid4()}"
    own = app.signature("c.own_id")
    own_id = own.freeze().id
    assert c.app.pikku.durable(group(own, app.signature("c.add", args=(1, 1)))).wait(30) == [
        own_id,
        2,
    ]
    fail = app.signature("c.boom", args=(2,))
    fail_id = fail.freeze().id
    fail.link_error(app.signature("c.record_errback_id", kwargs={"tag": tag}))
    with pytest.raises(ValueError):
        c.app.pikku.durable(fail).wait(timeout=30)
    wait_until(lambda: c.recorded(tag), timeout=10)
    assert c.recorded(tag) == [fail_id]  # the id the caller holds, once


def test_an_exception_comes_back_made_with_all_its_arguments(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    fail = app.signature("c.fail_with_args", args=("test", b"x"))
    fail_id = fail.freeze().id
    with pytest.raises(ValueError) as durable:
        c.app.pikku.durable(
            chain(app.signature("c.add", args=(1, 1)), fail.clone(immutable=True))
        ).wait(30)
    assert durable.value.args == ("Task expected to fail", "test", b"x")
    with pytest.raises(ValueError) as looked_up:
        AsyncResult(fail_id, app=app).get(timeout=10)
    assert looked_up.value.args == durable.value.args


def test_get_returns_once_the_task_ended_while_its_errback_still_runs(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    fail = app.signature("c.boom", args=(4,))
    fail.link_error(app.signature("c.slow", args=("errback", 10), immutable=True))
    result = c.app.pikku.durable(fail).async_result()
    # As AsyncResult.get(): the task's own outcome, not the run's (which
    # settles once its errback ended, ten seconds on).
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=8)
    assert not result.ready()
