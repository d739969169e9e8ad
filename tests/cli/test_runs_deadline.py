"""A run's deadline and a step's timeout, as ``runs show`` tells them."""

from __future__ import annotations

from typing import Any

from .test_cli import A, cli, cliapp, ok_json  # noqa: F401 - a fixture


def test_runs_show_tells_a_runs_deadline(cliapp: Any) -> None:  # noqa: F811
    run = cliapp.pikku.start("approval", timeout=3600)
    state = run.state()
    shown = ok_json(*A, "runs", "show", run.run_id)
    assert shown["run"]["deadline_at"] is not None
    assert state.deadline_at == state.created_at + 3_600_000
    assert all("timeout_s" in step for step in shown["steps"])
    human = cli(*A, "runs", "show", run.run_id)
    assert human.exit_code == 0 and "deadline" in human.output
    plain = cliapp.pikku.start("approval")
    assert ok_json(*A, "runs", "show", plain.run_id)["run"]["deadline_at"] is None
