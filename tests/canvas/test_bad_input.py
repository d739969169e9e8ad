"""Bad canvas input is refused at ``durable(...)`` with a clear error, nothing stored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group

from pikku_celery import CanvasError, PayloadError, Pikku, UnknownTaskError, UnknownWorkflowError
from pikku_celery.canvas.plan import compile_plan

CLOSED_BROKER = "amqp://guest:guest@127.0.0.1:1//"  # a publish would fail, not pass


@pytest.fixture
def pikku(tmp_path: Path) -> Iterator[Pikku]:
    app = Celery("bad-canvas", broker=CLOSED_BROKER, set_as_current=False)
    app.conf.broker_connection_retry = False
    engine = Pikku(
        app, f"sqlite:///{tmp_path / 'canvas.db'}", install_beat=False, max_input_bytes=200_000
    )

    @app.task(name="c.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="c.tsum", shared=False)
    def tsum(values: list[int]) -> int:
        return sum(values)

    yield engine
    assert engine.sql_engine is not None
    engine.sql_engine.dispose()


def _refused(pikku: Pikku, canvas: Any, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        pikku.durable(canvas)
    assert pikku.store.list_runs() == []  # nothing stored


def test_an_unknown_task_is_refused(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    canvas = chain(add.s(1, 2), pikku.app.signature("c.nope"))
    _refused(pikku, canvas, UnknownTaskError, r"canvas\.1: task 'c\.nope' is not registered")


def test_arguments_that_are_not_json_are_refused_naming_the_node(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    # Celery's JSON carries datetimes, bytes, UUIDs and Decimals; not any object.
    canvas = group(add.s(1, 2), add.s(1, when=object()))
    _refused(pikku, canvas, PayloadError, r"canvas node canvas\.1 \(c\.add\): kwargs\['when'\]")


def test_a_call_its_task_cannot_take_is_refused_when_its_arguments_are_known(
    pikku: Pikku,
) -> None:
    add = pikku.app.tasks["c.add"]
    # The first node's arguments, and an immutable one's, are known now:
    # checked as apply_async checks them (Celery raises the same TypeError).
    _refused(pikku, chain(add.s(1), add.s(2)), CanvasError, r"canvas\.0: c\.add cannot take")
    _refused(pikku, chain(add.s(1, 2), add.si(1, 2, 3)), TypeError, r"canvas\.1: c\.add")
    # One that gets the previous result prepended is checked when it runs.
    assert compile_plan(pikku.app, chain(add.s(1, 2), add.s(4)))["root"]["t"] == "chain"


def test_a_cycle_of_links_is_refused(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    first = add.s(1, 2)
    second = add.s(3)
    first.link(second)
    second.link(first)
    _refused(pikku, first, CanvasError, "a cycle")


def test_a_chord_with_an_empty_header_is_kept_for_its_body_to_get_an_empty_list(
    pikku: Pikku,
) -> None:
    add = pikku.app.tasks["c.add"]
    plan = compile_plan(pikku.app, chord([], add.s(1)))
    assert plan["root"]["t"] == "chord" and plan["root"]["header"] == []


def test_a_canvas_above_max_input_bytes_is_refused(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    canvas = group(add.s(i, "x" * 1000) for i in range(300))
    _refused(pikku, canvas, PayloadError, r"bytes of JSON, above the limit of 200000")


def test_a_canvas_with_more_steps_than_a_run_may_record_is_refused(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    canvas = chain(add.si(i, 1) for i in range(pikku.limits.max_steps_per_run + 1))
    _refused(pikku, canvas, CanvasError, r"may record 1001 steps .* \(max_steps_per_run\)")


def test_an_unsupported_option_is_refused(pikku: Pikku) -> None:
    canvas = pikku.app.tasks["c.add"].s(1, 2).set(expires=30)
    _refused(pikku, canvas, CanvasError, "option.* expires .* not supported durably")


def test_a_stamp_json_cannot_carry_is_refused_and_others_are_kept(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    bad = add.s(1, 2)
    bad.stamp(when=object())
    _refused(pikku, group(add.s(1, 1), bad), PayloadError, r"canvas node canvas\.1: stamp 'when'")
    kept = group(add.s(1, 1), add.s(2, 2).set(stamped_headers=["a"], a=2))
    kept.set(stamped_headers=["a", "b"], a=1, b=[1, 2])  # a member's own stamps are kept
    members = compile_plan(pikku.app, kept)["root"]["items"]
    assert [m["stamps"] for m in members] == [{"a": 1, "b": [1, 2]}, {"a": 2}]  # as Celery


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"priority": 300}, "priority must be an int 0-255"),
        ({"queue": ""}, "queue must not be empty"),
        ({"countdown": "soon"}, "countdown must be a number"),
    ],
)
def test_a_bad_routing_option_on_a_later_node_is_refused_before_the_run_starts(
    pikku: Pikku, options: dict[str, Any], says: str
) -> None:
    add = pikku.app.tasks["c.add"]
    canvas = chain(add.s(1, 2), add.s(3).set(**options))
    _refused(pikku, canvas, PayloadError, says)


def test_an_errback_that_is_not_a_task_is_refused(pikku: Pikku) -> None:
    add = pikku.app.tasks["c.add"]
    canvas = add.s(1, 2).on_error(chain(add.s(1, 1), add.s(2)))
    _refused(pikku, canvas, CanvasError, "link_error .* must be a task signature")


def test_something_that_is_not_a_canvas_is_refused(pikku: Pikku) -> None:
    _refused(pikku, "c.add", CanvasError, "takes a Celery signature")


def test_the_canvas_workflow_cannot_be_started_by_name(pikku: Pikku) -> None:
    # Its input names the tasks to run: only durable(), which checks the
    # canvas, starts it; by name (the web API, the CLI) it is refused.
    from flask import Flask

    from pikku_celery.contrib.flask import PikkuFlask, make_blueprint

    plan = {"pikku_canvas": 1, "root": {"t": "task", "task": "c.add", "args": [1, 2]}}
    with pytest.raises(UnknownWorkflowError, match="cannot be started by its name"):
        pikku.start("pikku.canvas", plan)
    app = Flask("canvas-api")
    PikkuFlask(pikku, app)
    app.register_blueprint(make_blueprint(permission=lambda action, target: True))
    answer = app.test_client().post("/workflows/pikku.canvas/runs", json={"input": plan})
    assert answer.status_code == 404
    assert "pikku.durable(canvas)" in answer.get_json()["message"]
    assert pikku.store.list_runs() == []
