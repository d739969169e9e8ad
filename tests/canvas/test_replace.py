"""``self.replace(sig)`` in a step or a canvas node, on a real worker.

The replacement is stored before it runs and its nodes are steps of their
own, so its result is the replaced task's, as in Celery, and a worker killed
midway leaves a run another worker finishes.
"""

from __future__ import annotations

import pytest
from celery import chain

from pikku_celery.store import AttemptStatus
from tests.helpers import wait_until
from tests.services import SESSION_TAG

from .cluster import CanvasCluster


def test_a_canvas_node_that_replaces_itself_passes_its_replacements_result_on(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chain(
        app.signature("c.add", args=(1, 2)),
        app.signature("c.replace_with_chain"),
        app.signature("c.add", args=(5,)),
    )
    assert c.app.pikku.durable(canvas).wait(timeout=30) == (3 + 1) * 10 + 5


def test_a_workflow_step_whose_task_replaces_itself_returns_the_replacements_result(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    run = c.app.pikku.start("c.replacing_workflow", 2)
    assert run.wait(timeout=30) == {"replaced": 30, "grouped": [3, 4], "after": 2}
    names = [h.step.name for h in run.steps()]
    assert names == ["replaced", "replaced~replaced", "grouped", "grouped~replaced", "after"]


def test_a_failing_replacement_raises_the_tasks_own_error(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    canvas = chain(app.signature("c.add", args=(1, 2)), app.signature("c.replace_with_boom"))
    with pytest.raises(ValueError, match="boom"):
        c.app.pikku.durable(canvas).wait(timeout=30)


@pytest.mark.slow
def test_a_worker_killed_mid_replacement_leaves_a_run_another_worker_finishes(
    shared_canvas_cluster: CanvasCluster,
) -> None:
    c = shared_canvas_cluster
    app = c.app.app
    key = f"replace-kill-{SESSION_TAG}"
    canvas = chain(
        app.signature("c.add", args=(3, 4)), app.signature("c.replace_with_hang", args=(key,))
    )
    run = c.app.pikku.durable(canvas)
    wait_until((c.workdir / f"{key}.pid").exists, timeout=30)
    c.add_worker()  # ready before the kill: the takeover waits only for the lease
    c.workers[0].kill()
    try:
        assert run.wait(timeout=60) == 7
    except Exception:
        print(c.logs())
        raise
    assert c.ledger_rows(key) == 1  # the replacement's last node ran once
    assert c.recorded(f"{key}:replaced") == [7]  # the replaced task ran once
    history = {h.step.name: h for h in run.steps()}
    assert [a.status for a in history["canvas.1"].attempts] == [AttemptStatus.SUCCEEDED]
