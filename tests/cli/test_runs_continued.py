"""A continue_as_new chain, as ``runs show`` tells it from either end."""

from __future__ import annotations

from typing import Any

from pikku_celery import Context

from .test_cli import A, cli, cliapp, ok_json  # noqa: F401 - a fixture


def test_runs_show_links_a_run_and_the_run_it_continued_as(cliapp: Any) -> None:  # noqa: F811
    @cliapp.pikku.workflow(name="rollover")
    def rollover(ctx: Context, n: int) -> int:
        if n > 0:
            ctx.continue_as_new(n - 1)
        return n

    first = rollover.start(1)  # its first pass, taken here, continues
    successor = first.successor()
    assert successor is not None

    shown = ok_json(*A, "runs", "show", first.run_id)["run"]
    assert shown["status"] == "completed"
    assert shown["continued_as"] == successor.run_id and shown["continued_from"] is None
    after = ok_json(*A, "runs", "show", successor.run_id)["run"]
    assert after["continued_from"] == first.run_id and after["continued_as"] is None

    human = cli(*A, "runs", "show", first.run_id).output
    assert "continued as" in human and successor.run_id in human
    human = cli(*A, "runs", "show", successor.run_id).output
    assert "continued from" in human and first.run_id in human
