"""A durable canvas's plan is stored whole before anything runs, and is the run's own."""

from __future__ import annotations

from typing import Any

import pytest
from celery import chain, chord, group

from pikku_celery import IdempotencyKeyReusedError, StepStatus
from pikku_celery.canvas.shape import walk
from tests.cli.test_cli import cliapp, drive

__all__ = ["cliapp"]  # the CLI tests' app (SQLite store, steps run by hand)


def test_the_whole_plan_is_stored_before_anything_runs_and_later_edits_do_not_reach_it(
    cliapp: Any,
) -> None:
    add, ship = cliapp.add, cliapp.ship
    header = [add.s(10), add.s(20)]
    canvas = chain(add.s(1, 2), chord(header, ship.s()))
    run = cliapp.pikku.durable(canvas)
    plan = run.state().input
    paths = [path for path, node in walk(plan["root"]) if node["t"] == "task"]
    assert paths == ["canvas.0", "canvas.1.h0", "canvas.1.h1", "canvas.1.body"]
    # Nothing ran yet: only the first node is recorded, waiting for a worker.
    assert [(h.step.name, h.step.status) for h in run.steps()] == [
        ("canvas.0", StepStatus.SCHEDULED)
    ]
    header[0].link(add.s(1000))  # the caller's canvas changes after the start ...
    drive(cliapp, run.run_id)
    assert run.wait(timeout=1) == "parcel-[13, 23]"
    # ... the run's stored plan does not.
    assert [h.step.name for h in run.steps()] == paths


def test_an_idempotency_key_gives_the_same_run_for_the_same_canvas(cliapp: Any) -> None:
    add = cliapp.add
    first = cliapp.pikku.durable(chain(add.s(1, 2), add.s(3)), idempotency_key="canvas-1")
    again = cliapp.pikku.durable(chain(add.s(1, 2), add.s(3)), idempotency_key="canvas-1")
    assert again.run_id == first.run_id
    with pytest.raises(IdempotencyKeyReusedError):
        cliapp.pikku.durable(chain(add.s(1, 2), add.s(4)), idempotency_key="canvas-1")


def test_a_node_that_raises_fails_at_once_as_in_celery(cliapp: Any) -> None:
    # A canvas node keeps spare attempts for workers that die under it, but a
    # task that raises without asking to retry is not run again.
    run = cliapp.pikku.durable(chain(cliapp.add.s(1, 2), cliapp.flaky.s()))
    drive(cliapp, run.run_id)
    with pytest.raises(RuntimeError, match=r"flaky refused 3 \[on purpose\]"):
        run.wait(timeout=1)
    flaky = {h.step.name: h for h in run.steps()}["canvas.1"]
    assert flaky.step.max_attempts > 1
    assert len(flaky.attempts) == 1


def test_a_large_group_counts_the_steps_of_each_run_it_holds(cliapp: Any) -> None:
    # Its members run in slices, child runs of their own: the group's run
    # records one step per slice, so a group above the step limit still runs.
    pikku, add = cliapp.pikku, cliapp.add
    members = pikku.limits.max_steps_per_run + 1
    run = pikku.durable(group(add.s(i, 1) for i in range(members)))
    names = [h.step.name for h in run.steps()]
    assert 1 < len(names) < members and all("~part" in name for name in names)
