"""``pikku-celery runs show`` draws a durable canvas as the tree of its nodes."""

from __future__ import annotations

from typing import Any

from celery import chain, chord

from tests.cli.test_cli import A, cli, cliapp, drive

__all__ = ["cliapp"]  # the CLI tests' app, as a fixture here too


def test_runs_show_draws_the_canvas_tree_with_each_node_s_state(cliapp: Any) -> None:
    add, ship = cliapp.add, cliapp.ship
    canvas = chain(add.s(1, 2), chord([add.s(10), add.s(20)], ship.s()))
    run = cliapp.pikku.durable(canvas)
    drive(cliapp, run.run_id)
    shown = cli(*A, "runs", "show", run.run_id)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()

    def line(*parts: str) -> str:
        found = [text for text in lines if all(p in text for p in parts)]
        assert found, f"no line with {parts} in:\n{shown.output}"
        return found[0]

    assert "chain" in line("chain", "canvas")
    assert "succeeded" in line("cliapp.add(1, 2)", "canvas.0")
    line("chord", "canvas.1")
    assert "-> 13" in line("header: cliapp.add(10)", "canvas.1.h0")
    assert "-> 23" in line("header: cliapp.add(20)", "canvas.1.h1")
    assert "parcel-[13, 23]" in line("body: cliapp.ship()", "canvas.1.body")
    assert run.wait(timeout=1) == "parcel-[13, 23]"


def test_a_node_not_started_yet_says_so(cliapp: Any) -> None:
    run = cliapp.pikku.durable(chain(cliapp.add.s(1, 2), cliapp.ship.s()))
    shown = cli(*A, "runs", "show", run.run_id)
    assert "not started" in next(t for t in shown.output.splitlines() if "canvas.1" in t)
