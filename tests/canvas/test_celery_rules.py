"""Celery's rules a durable canvas keeps, on a real worker: an empty chord
header, a delay on a composite, a node's own priority, starmap and chunks."""

from __future__ import annotations

from datetime import UTC, datetime

from celery import chain, chord, group

from .cluster import CanvasCluster


def test_a_chord_with_an_empty_header_calls_its_body_with_an_empty_list(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chord(group([]), app.signature("c.tsum", args=(7,)))
    assert c.app.pikku.durable(canvas).wait(timeout=30) == 7


def test_a_countdown_on_a_chord_delays_its_header_with_durable_timers(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    header = [app.signature("c.own_eta"), app.signature("c.own_eta")]
    canvas = chord(header, app.signature("c.collect")).set(countdown=0.5)
    run = c.app.pikku.durable(canvas)
    (etas,) = run.wait(timeout=30)["args"]
    # Each header task was delayed, and its request says when it became due.
    assert all(datetime.fromisoformat(eta) > datetime(2026, 1, 1, tzinfo=UTC) for eta in etas)
    names = [h.step.name for h in run.steps()]
    assert "canvas.h0.countdown" in names and "canvas.h1.countdown" in names
    assert "canvas.body.countdown" not in names


def test_each_node_sees_its_own_priority_even_when_run_eagerly(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chain(
        app.signature("c.own_priority").set(priority=3),
        app.signature("c.own_priority").set(priority=5),
    )
    assert c.app.pikku.durable(canvas).wait(timeout=30) == 5


def test_a_nodes_own_soft_time_limit_is_enforced_on_its_message(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    header = [
        app.signature("c.add", args=(1, 2)),
        app.signature("c.soft_guarded", args=(100,)).set(soft_time_limit=0.5),
    ]
    run = c.app.pikku.durable(chord(header, app.signature("c.tsum")))
    assert run.wait(timeout=30) == 3  # the guarded task caught its soft limit
    (guarded,) = [h for h in run.steps() if h.step.name == "canvas.h1"]
    assert [a.dispatch for a in guarded.attempts] == ["broker"]


def test_starmap_and_chunks_run_as_celery_runs_them(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    add = app.tasks["c.add"]
    starmap = add.starmap([(1, 1), (2, 2)])
    starmap_id = starmap.freeze().id
    in_chain = chain(add.si(1, 1), starmap)  # a map is immutable, as in Celery
    result = c.app.pikku.durable(in_chain).async_result()
    assert result.id == starmap_id and result.get(timeout=30) == [2, 4]
    in_group = group(add.starmap([(1, 1), (2, 2)]), add.s(3, 3))
    assert c.app.pikku.durable(in_group).wait(timeout=30) == [[2, 4], 6]
    chunks = add.chunks([(i, i) for i in range(5)], 2)
    assert c.app.pikku.durable(chunks).wait(timeout=30) == [[0, 2], [4, 6], [8]]
