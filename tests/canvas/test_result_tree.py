"""A durable canvas's result has the tree ``apply_async()`` returns, on a real worker.

``parent``, ``children``, ``results`` and ``as_tuple()`` link the same
results Celery links (a chain's previous task, a group's members, a chord's
header), each answering ``get()`` from the result backend once it settled.
"""

from __future__ import annotations

import pytest
from celery import chain, chord, group
from celery.result import AsyncResult, GroupResult

from .cluster import CanvasCluster


def _ids(tree: object) -> list[str]:
    """Every id in Celery's ``as_tuple()`` form of a result tree."""
    (own, parent), children = tree
    found = [own, *(_ids(parent) if parent else [])]
    for child in children or []:
        found += _ids(child)
    return found


def test_a_chains_result_has_the_previous_tasks_as_parents(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    add, boom = app.signature("c.add", args=(1, 2)), app.signature("c.boom")
    first_id = add.freeze().id
    result = c.app.pikku.durable(chain(add, boom, app.signature("c.add", args=(4,)))).async_result()
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=30)
    with pytest.raises(ValueError, match="boom"):
        result.parent.get(timeout=30)  # the task that failed
    assert result.parent.parent.id == first_id
    assert result.parent.parent.get(timeout=30) == 3
    assert result.parent.parent.parent is None


def test_a_groups_result_has_its_members_results(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    inner = group(
        app.signature("c.add", args=(3, 0), immutable=True),
        app.signature("c.add", args=(4, 0), immutable=True),
    )
    canvas = group(
        app.signature("c.add", args=(1, 0)), chain(app.signature("c.add", args=(2, 0)), inner)
    )
    result = c.app.pikku.durable(canvas).async_result()
    assert result.get(timeout=30) == [1, [3, 4]]
    assert result.results[0].get(timeout=30) == 1
    assert isinstance(result.children[1], GroupResult)
    assert result.children[1].get(timeout=30) == [3, 4]
    assert result.children[1].parent.get(timeout=30) == 2
    ids = _ids(result.as_tuple())
    assert len(ids) == len(set(ids)) == 6  # two groups, four tasks, each once


def test_a_chords_result_has_its_header_as_parent(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    header = [app.signature("c.add", args=(i, 1)) for i in range(3)]
    result = c.app.pikku.durable(chord(header, app.signature("c.tsum"))).async_result()
    assert result.get(timeout=30) == 6
    assert isinstance(result.parent, GroupResult)
    assert result.parent.get(timeout=30) == [1, 2, 3]
    assert all(isinstance(r, AsyncResult) for r in result.parent.results)
