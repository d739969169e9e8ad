"""A canvas node's own request fields, on a real worker, as plain Celery gives them.

Stamps (Celery's stamping API) reach the task's ``self.request`` whether its
step runs eagerly or travels as a message of its own, and a step's message
carries them in its headers (what ``task_received`` handlers see).
``request.root_id`` / ``parent_id`` name the tasks Celery would name. A chord
after a failed header has its result id marked failed in the result
backend, so what waits on it (a group around its chain) ends.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import chain, chord, group
from celery.canvas import Signature, StampingVisitor
from celery.result import AsyncResult

from tests.helpers import wait_until

from .cluster import CanvasCluster

pytestmark = pytest.mark.slow


class _Stamp(StampingVisitor):  # type: ignore[misc]
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
        return {"tag": self.tag, "answer": 42}


def _stamped(canvas: Signature, tag: str) -> Signature:
    canvas.stamp(visitor=_Stamp(tag))
    return canvas


@pytest.mark.parametrize("travels", [False, True], ids=["eager", "message"])
def test_the_task_sees_its_stamps_as_in_plain_celery(
    shared_canvas_cluster: CanvasCluster, travels: bool
) -> None:
    c = shared_canvas_cluster
    app = c.app.app

    def canvas(tag: str) -> Signature:
        seen = app.signature("c.stamps_seen", immutable=True)
        if travels:
            seen = seen.set(time_limit=30)  # a step with its own time limit is a message
        return _stamped(chain(app.signature("c.add", args=(1, 1)), seen), tag)

    plain = canvas(f"p-{uuid.uuid4()}").apply_async().get(timeout=30)
    tag = f"d-{uuid.uuid4()}"
    durable = c.app.pikku.durable(canvas(tag)).wait(30)
    assert plain["stamped_headers"] == ["answer", "tag"]
    assert durable == {**plain, "stamps": {**plain["stamps"], "tag": tag}}
    received = c.recorded(f"received:{tag}")
    if travels:
        assert {"answer": 42, "tag": tag} in received  # in the step message's headers
    assert all(r == {"answer": 42, "tag": tag} for r in received)


def test_a_groups_stamps_reach_its_members(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    seen = app.signature("c.stamps_seen", immutable=True)
    tagged = group(seen, seen.clone())
    tagged.set(stamped_headers=["tag"], tag="g")  # a composite's own stamp
    plain = tagged.apply_async().get(timeout=30)
    durable = c.app.pikku.durable(tagged).wait(30)
    assert durable == plain == [{"stamped_headers": ["tag"], "stamps": {"tag": "g"}}] * 2


def _lineage(c: CanvasCluster, tag: str) -> dict[str, tuple[str | None, str | None]]:
    """What each labelled task saw: ``label -> (root label, parent label)``,
    an id no task of the canvas had kept as it is."""
    rows = c.recorded(tag)
    labels = {own: label for label, own, _, _ in rows}
    return {
        label: (labels.get(root, root), labels.get(parent, parent))
        for label, _, root, parent in rows
    }


def _both(c: CanvasCluster, build: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lineage each task saw, the canvas run plainly, then durably."""
    plain_tag, durable_tag = f"lp-{uuid.uuid4()}", f"ld-{uuid.uuid4()}"
    build(plain_tag).apply_async().get(timeout=30)
    c.app.pikku.durable(build(durable_tag)).wait(30)
    return _lineage(c, plain_tag), _lineage(c, durable_tag)


def test_root_and_parent_ids_of_a_chain_and_a_group_after_it(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app

    def build(tag: str) -> Signature:
        def node(label: str) -> Signature:
            return app.signature("c.lineage", args=(label, tag), immutable=True)

        return chain(node("a"), node("b"), group(node("c"), node("d")))

    plain, durable = _both(c, build)
    expected = {"a": ("a", None), "b": ("a", "a"), "c": ("a", "b"), "d": ("a", "b")}
    assert durable == plain == expected


def test_root_and_parent_ids_around_a_chord(shared_canvas_cluster: CanvasCluster) -> None:
    c = shared_canvas_cluster
    app = c.app.app

    def build(tag: str) -> Signature:
        def node(label: str) -> Signature:
            return app.signature("c.lineage", args=(label, tag), immutable=True)

        body = chain(node("body"), node("after"))
        linked = node("x").set(link=node("link"))
        return chain(node("a"), chord([linked, node("y")], body))

    plain, durable = _both(c, build)
    for seen in (plain, durable):
        assert seen["a"] == ("a", None)
        assert seen["x"] == seen["y"] == ("a", "a")
        assert seen["link"] == ("a", "x")  # sent by the task it is linked to
        root, parent = seen["body"]
        assert root == "a" and parent in ("x", "y")  # the header member that completed it
        assert seen["after"] == ("a", "body")


@pytest.mark.parametrize("failing", [1, 2])
def test_a_chord_after_a_failed_header_is_marked_failed(
    shared_canvas_cluster: CanvasCluster, failing: int
) -> None:
    c = shared_canvas_cluster
    app = c.app.app

    def s(name: str, *args: Any) -> Signature:
        return app.signature(name, args=args)

    def build() -> Signature:
        header = [s("c.add", 1, 1), s("c.boom")] if failing == 1 else [s("c.boom"), s("c.boom")]
        inner = chain(
            chord(header, s("c.tsum")),
            chord([s("c.add", 1), s("c.add", 2)], s("c.tsum")),
        )
        return group(inner, s("c.add", 1, 1))

    plain = build().apply_async()
    with pytest.raises(Exception):  # noqa: B017 - Celery's own ChordError or the task's
        plain.get(timeout=30)
    wait_until(lambda: plain.results[0].state == "FAILURE", timeout=20)
    durable = c.app.pikku.durable(build()).async_result()
    with pytest.raises(ValueError, match="boom"):
        durable.get(timeout=30)
    last = AsyncResult(durable.results[0].id, app=app)
    wait_until(lambda: last.state == "FAILURE", timeout=20)
    assert type(last.result).__name__ == type(plain.results[0].result).__name__


def test_a_replacement_is_sent_by_the_task_it_replaces(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app

    def build(tag: str) -> Signature:
        return chain(
            app.signature("c.lineage", args=("a", tag), immutable=True),
            app.signature("c.replace_with_lineage", args=(tag,), immutable=True),
        )

    plain, durable = _both(c, build)
    # The replacement's last task has the replaced task's id (Celery's
    # ``replace``), so the labels name it "r2" wherever that id appears.
    assert durable == plain
    assert plain["r1"] == ("a", "r2")  # sent by the task it replaces (whose id r2 took)
