"""A run waiting for its concurrency key shows as ``queued`` in ``runs list``,
``runs show`` and the run page's JSON API, and runs once its key frees."""

from __future__ import annotations

from typing import Any

from pikku_celery.web.api import RunApi
from pikku_celery.web.permissions import allow_all

from .test_cli import A, cli, cliapp, drive, ok_json, start

__all__ = ["cliapp"]  # the fixture, used by name


def test_a_queued_run_is_shown_queued_until_its_key_frees(cliapp: Any) -> None:
    first = start(cliapp, "one_per_customer", {"customer": "c1", "a": 1})
    second = start(cliapp, "one_per_customer", {"customer": "c1", "a": 2})
    listed = {r["id"]: r["status"] for r in ok_json(*A, "runs", "list")["runs"]}
    assert (listed[first], listed[second]) == ("running", "queued")
    only_queued = ok_json(*A, "runs", "list", "--status", "queued")["runs"]
    assert [r["id"] for r in only_queued] == [second]
    assert ok_json(*A, "runs", "show", second)["run"]["status"] == "queued"
    assert "queued" in cli(*A, "runs", "show", second).output
    page = RunApi(cliapp.pikku, allow_all).runs({}).body
    assert page["counts"]["queued"] == 1

    drive(cliapp, first)  # the first run completes: its slot goes to the second
    assert ok_json(*A, "runs", "show", first)["run"]["status"] == "completed"
    cliapp.pikku.orchestrate(second, "admitted")  # the wake-up message, taken by hand
    drive(cliapp, second)
    assert ok_json(*A, "runs", "show", second)["run"]["status"] == "completed"
