"""A large group runs in slices (child runs), yet answers as the same group would, on a real worker.

Celery's own suite starts 1,000-member groups and chord headers; here the
groups are big enough to be cut into several slices. What the caller sees
does not change: the results in order, each member's own id (its task sees
it, ``AsyncResult`` finds it), a member's own exception, its errback once.
"""

from __future__ import annotations

import uuid

import pytest
from celery import chain, chord, group
from celery.result import AsyncResult

from pikku_celery import CanvasError
from pikku_celery.canvas.evaluate import SLICE_ABOVE
from tests.helpers import wait_until

from .cluster import CanvasCluster

MEMBERS = 10 * SLICE_ABOVE


def test_a_large_group_gives_its_results_in_order(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    run = c.app.pikku.durable(group(app.signature("c.add", args=(i, 1)) for i in range(MEMBERS)))
    assert run.wait(timeout=120) == [i + 1 for i in range(MEMBERS)]
    # The run itself holds one step per slice, not one per member.
    names = [h.step.name for h in run.steps()]
    assert all("~part" in name for name in names) and 1 < len(names) < MEMBERS


def test_a_large_chord_header_is_fed_by_the_chain_before_it(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    header = [app.signature("c.add", args=(i,)) for i in range(MEMBERS)]
    canvas = chain(app.signature("c.add", args=(1, 1)), chord(header, app.signature("c.tsum")))
    assert c.app.pikku.durable(canvas).wait(timeout=120) == sum(i + 2 for i in range(MEMBERS))


def test_a_member_of_a_large_group_keeps_its_id_error_and_errback(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    tag = f"large-{uuid.uuid4()}"
    own = app.signature("c.own_id")
    own_id = own.freeze().id
    fail = app.signature("c.boom", args=(7,))
    fail_id = fail.freeze().id
    fail.link_error(app.signature("c.record_errback_id", kwargs={"tag": tag}))
    members = [app.signature("c.add", args=(i, 1)) for i in range(MEMBERS)]
    members[3 * SLICE_ABOVE] = own
    members[-1] = fail
    result = c.app.pikku.durable(group(members)).async_result()
    with pytest.raises(ValueError, match=r"boom \(7,\)"):
        result.get(timeout=120)
    assert AsyncResult(own_id, app=app).get(timeout=10) == own_id  # the id its task saw
    with pytest.raises(ValueError, match="boom"):
        AsyncResult(fail_id, app=app).get(timeout=10)
    wait_until(lambda: c.recorded(tag), timeout=10)
    assert c.recorded(tag) == [fail_id]


def test_a_canvas_needing_more_slices_than_a_run_may_start_is_refused(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    # Each large group starts ten slices from the run that holds it.
    limit = c.app.pikku.limits.max_children_per_run
    big = [group(app.signature("c.add", args=(i, 1)) for i in range(MEMBERS))]
    canvas = group(*[chain(app.signature("c.add", args=(0, 0)), g) for g in big * limit])
    with pytest.raises(CanvasError, match="max_children_per_run"):
        c.app.pikku.durable(canvas)
