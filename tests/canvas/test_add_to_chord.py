"""``self.add_to_chord(sig)`` in a chord header member, on a real worker: what
it adds runs durably and its result joins the header's list for the body."""

from __future__ import annotations

import pytest
from celery import chain, chord

from .cluster import CanvasCluster


def test_tasks_added_to_a_chord_join_its_header(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chord(
        [app.signature("c.adds_to_chord", args=([1, 2, 3], 4))], app.signature("c.collect")
    )
    run = c.app.pikku.durable(canvas)
    collected = run.wait(timeout=30)
    assert sorted(collected["args"][0]) == [0, 5, 6, 7]  # the member's 0, then what it added
    names = {h.step.name for h in run.steps()}
    assert {"canvas.h0~added0", "canvas.h0~added1", "canvas.h0~added2"} <= names


def test_a_canvas_added_to_a_chord_gives_its_own_result(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chord(
        [app.signature("c.adds_chord_to_chord", args=([1, 2], 10))], app.signature("c.collect")
    )
    assert sorted(c.app.pikku.durable(canvas).wait(timeout=30)["args"][0]) == [0, 11 + 12]


def test_add_to_chord_outside_a_chord_fails_as_in_celery(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    alone = chain(
        app.signature("c.add", args=(1, 1)),
        app.signature("c.adds_to_chord", args=([1], 4), immutable=True),
    )
    with pytest.raises(ValueError, match="Current task is not member of any chord"):
        c.app.pikku.durable(alone).wait(timeout=30)
