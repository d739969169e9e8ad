"""``schedules list``: each schedule's last tick, its run, and its next tick,
from the app (definitions) or the database alone (its rows)."""

from __future__ import annotations

from typing import Any

from pikku_celery.celery.integration import SCHEDULES_BEAT_ENTRY
from pikku_celery.schedule import ScheduleState
from pikku_celery.schedule.spec import Every
from tests.cli.test_cli import A, cli, cliapp, ok_json

__all__ = ["cliapp"]  # the fixture, shared with test_cli


def test_schedules_list_with_the_app_and_with_the_database_alone(cliapp: Any) -> None:
    pikku = cliapp.pikku
    assert SCHEDULES_BEAT_ENTRY not in (pikku.app.conf.beat_schedule or {})
    pikku.schedule("order", every=3600, input={"a": 1, "b": 2}, name="hourly")
    pikku.schedule("approval", cron="0 3 * * *", name="nightly", overlap="allow", catch_up=1)
    entry = pikku.app.conf.beat_schedule[SCHEDULES_BEAT_ENTRY]
    assert (entry["task"], entry["schedule"]) == ("pikku.schedules", pikku.schedule_interval)

    shown = ok_json(*A, "schedules", "list")
    hourly, nightly = shown["schedules"]
    assert (hourly["name"], hourly["spec"], hourly["last_tick"]) == ("hourly", "every 3600s", None)
    assert nightly["spec"] == "cron 0 3 * * *" and nightly["overlap"] == "allow"
    assert nightly["next_tick"].endswith("T03:00:00.000Z")

    # A tick an hour ago starts a run (as a beat's pass would, an hour later).
    now = pikku.store.now_ms()
    tick = Every(3_600_000).latest(now)
    pikku.schedule_store.note_tick(
        ScheduleState("hourly", "order", "every 3600s", tick - 3_600_000, tick, None, now)
    )
    report = pikku.schedules_task.apply().get()  # what beat's pikku-schedules entry runs
    [(name, started_tick, run_id)] = report["started"]
    assert (name, started_tick) == ("hourly", tick)
    hourly = ok_json(*A, "schedules", "list")["schedules"][0]
    assert hourly["last_run_id"] == run_id and hourly["last_run_status"] == "running"
    assert hourly["next_tick_ms"] == tick + 3_600_000 and not hourly["due"]
    text = cli(*A, "schedules", "list").output
    assert "hourly" in text and f"{run_id} running" in text and "(in " in text

    # The database alone: the rows, with the next tick each recorded.
    url = str(pikku.sql_engine.url)
    alone = ok_json("schedules", "list", "--database-url", url)
    row, first_seen = alone["schedules"]
    assert (row["name"], row["defined"], row["last_run_id"]) == ("hourly", False, run_id)
    assert row["next_tick_ms"] == tick + 3_600_000
    assert first_seen["name"] == "nightly" and first_seen["last_run_id"] is None
