"""What a pass over the schedules starts, on a clock the test moves.

The engine runs on in-memory adapters; the store's clock is the test's, so
ticks, missed ticks and catch-up are exact. Real beats racing on a real
database are in ``test_two_beats``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from pikku_celery import Context, PayloadError, RunStatus
from pikku_celery.engine.core import WorkflowEngine
from pikku_celery.schedule import Cron, Every, InMemoryScheduleStore, ScheduleState
from pikku_celery.store.memory import InMemoryWorkflowStore
from pikku_celery.testing import InlineDispatcher, make_engine

T0 = 1_800_000_000_000  # a whole multiple of every interval used here


@dataclass
class Clock:
    now: int = T0 + 100

    def __call__(self) -> int:
        return self.now

    def at(self, seconds: float) -> None:
        """Move to ``seconds`` after T0 (plus a little: a pass is never on the tick)."""
        self.now = T0 + round(seconds * 1000) + 100


@dataclass
class Env:
    engine: WorkflowEngine
    clock: Clock
    dispatcher: InlineDispatcher

    def keys(self, workflow: str) -> list[str]:
        runs = self.engine.store.list_runs(workflow=workflow, limit=1000)
        return sorted(r.idempotency_key or "" for r in runs)


@pytest.fixture
def env() -> Iterator[Env]:
    clock = Clock()
    engine, dispatcher = make_engine(InMemoryWorkflowStore(clock))

    @engine.workflow(name="report")
    def report(ctx: Context, data: Any) -> Any:
        return data

    @engine.workflow(name="slow")
    def slow(ctx: Context) -> Any:
        return ctx.wait_for_signal("done")

    yield Env(engine, clock, dispatcher)


def test_the_first_pass_records_the_schedule_and_each_tick_starts_one_run(env: Env) -> None:
    env.engine.schedule("report", every=5, input={"kind": "daily"})
    assert env.engine.run_schedules().started == []  # from the next tick on
    env.clock.at(5)
    [(name, tick, run_id)] = env.engine.run_schedules().started
    assert (name, tick) == ("report", T0 + 5000)
    assert env.engine.handle(run_id).result() == {"kind": "daily"}
    assert env.engine.run_schedules().started == []  # the same tick again: nothing
    env.clock.at(9.8)
    assert env.engine.run_schedules().started == []
    env.clock.at(10)
    assert [t for _, t, _ in env.engine.run_schedules().started] == [T0 + 10_000]
    assert env.keys("report") == [
        "schedule:report:2027-01-15T08:00:05.000Z",
        "schedule:report:2027-01-15T08:00:10.000Z",
    ]


def test_a_tick_seen_again_after_its_row_was_lost_starts_no_second_run(env: Env) -> None:
    """A beat that started a tick's run and died before recording it: the next
    pass finds the run by the tick's idempotency key."""
    env.engine.schedule("report", every=5)
    env.engine.run_schedules()
    env.clock.at(5)
    [(_, _, first)] = env.engine.run_schedules().started
    env.engine.schedule_store = forgetful = InMemoryScheduleStore(env.clock)
    forgetful.note_tick(ScheduleState("report", "report", "every 5s", T0, T0 + 5000, None, 0))
    [(_, _, again)] = env.engine.run_schedules().started
    assert again == first and len(env.keys("report")) == 1


def test_catch_up_starts_that_many_missed_ticks_before_the_newest(env: Env) -> None:
    env.engine.schedule("report", every=5, catch_up=2)
    env.engine.run_schedules()
    env.clock.at(5)
    env.engine.run_schedules()
    env.clock.at(31)  # beat was down: ticks 10, 15, 20, 25 and 30 passed unseen
    report = env.engine.run_schedules()
    assert [t - T0 for _, t, _ in report.started] == [20_000, 25_000, 30_000]
    assert report.dropped == [("report", 2)]
    assert len(env.keys("report")) == 4


def test_a_tick_started_by_a_pass_that_died_before_noting_it_is_not_counted_dropped(
    env: Env,
) -> None:
    """The beat started tick 10's run and died before recording it, then stayed
    down: tick 10 ran, so only the ticks nobody started are reported dropped."""
    env.engine.schedule("report", every=5, catch_up=1)
    env.engine.run_schedules()
    env.clock.at(5)
    env.engine.run_schedules()
    env.clock.at(10)
    env.engine.run_schedules()
    env.engine.schedule_store = behind = InMemoryScheduleStore(env.clock)
    behind.note_tick(ScheduleState("report", "report", "every 5s", T0 + 5000, T0 + 10_000, None, 0))
    env.clock.at(31)  # ticks 15, 20, 25 and 30 passed unseen
    report = env.engine.run_schedules()
    assert [t - T0 for _, t, _ in report.started] == [25_000, 30_000]
    assert report.dropped == [("report", 2)]
    assert len(env.keys("report")) == 4


def test_without_catch_up_only_the_newest_missed_tick_starts(env: Env) -> None:
    env.engine.schedule("report", every=timedelta(seconds=5))
    env.engine.run_schedules()
    env.clock.at(60)
    assert [t - T0 for _, t, _ in env.engine.run_schedules().started] == [60_000]


def test_overlap_skip_allow_and_cancel_previous(env: Env) -> None:
    engine = env.engine
    engine.schedule("slow", every=5, name="skipping")
    engine.schedule("slow", every=5, name="allowing", overlap="allow")
    engine.schedule("slow", every=5, name="cancelling", overlap="cancel_previous")
    engine.run_schedules()
    env.clock.at(5)
    first = {name: run for name, _, run in engine.run_schedules().started}
    assert set(first) == {"skipping", "allowing", "cancelling"}
    env.clock.at(10)
    report = engine.run_schedules()
    assert report.skipped == [("skipping", T0 + 10_000)]
    second = {name: run for name, _, run in report.started}
    assert set(second) == {"allowing", "cancelling"}
    assert engine.store.get_run(first["allowing"]).status == RunStatus.RUNNING  # type: ignore[union-attr]
    cancelled = engine.store.get_run(first["cancelling"])
    assert cancelled is not None and cancelled.cancel_requested
    [entry] = engine.store.audit_trail(first["cancelling"])
    assert (entry.action, entry.actor) == ("cancel", "schedule:cancelling")
    # The skipped schedule starts again once its run ended.
    engine.send_signal(first["skipping"], "done")
    env.dispatcher.run_until_idle()
    env.clock.at(15)
    assert "skipping" in {name for name, _, _ in engine.run_schedules().started}


def test_a_failing_schedule_stops_no_other(env: Env) -> None:
    env.engine.schedule("nosuch", every=5)
    env.engine.schedule("report", every=5, name="good")
    env.engine.run_schedules()
    env.clock.at(5)
    report = env.engine.run_schedules()
    assert [name for name, _, _ in report.started] == ["good"]
    assert "UnknownWorkflowError" in report.failed["nosuch"]


def test_stacked_on_a_workflow_it_returns_the_workflow(env: Env) -> None:
    @env.engine.schedule(cron="*/5 * * * *", input=1)
    @env.engine.workflow(name="stacked")
    def stacked(ctx: Context, data: int) -> int:
        return data

    assert stacked.name == "stacked"
    schedule = env.engine.schedules["stacked"]
    assert isinstance(schedule.spec, Cron) and schedule.input == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of every= and cron="),
        ({"every": 5, "cron": "* * * * *"}, "exactly one of every= and cron="),
        ({"every": 0}, "positive interval"),
        ({"cron": "every minute"}, "not a valid cron expression"),
        ({"every": 5, "overlap": "queue"}, "overlap='queue' is not one of"),
        ({"every": 5, "catch_up": -1}, "catch_up= must be a whole number"),
    ],
)
def test_a_bad_schedule_is_refused_when_defined(
    env: Env, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        env.engine.schedule("report", **options)
    assert env.engine.schedules == {}


def test_input_that_is_not_json_and_a_reused_name_are_refused(env: Env) -> None:
    with pytest.raises(PayloadError):
        env.engine.schedule("report", every=5, input={"when": object()})
    env.engine.schedule("report", every=5)
    with pytest.raises(ValueError, match="already defined"):
        env.engine.schedule("report", cron="* * * * *")


def test_ticks_are_whole_multiples_of_the_interval_and_cron_times_in_utc() -> None:
    every = Every(5000)
    assert (every.latest(T0 + 4999), every.next_after(T0 + 4999)) == (T0, T0 + 5000)
    assert every.next_after(T0) == T0 + 5000
    assert list(zip(range(3), every.before(T0), strict=False)) == [
        (0, T0 - 5000),
        (1, T0 - 10_000),
        (2, T0 - 15_000),
    ]
    cron = Cron("*/5 * * * *")
    assert cron.latest(T0 + 100) == T0  # 08:00:00 UTC
    assert cron.next_after(T0) == T0 + 300_000
    assert next(cron.before(T0)) == T0 - 300_000
    assert cron.describe() == "cron */5 * * * *" and every.describe() == "every 5s"


def test_a_late_pass_starts_every_tick_within_its_grace_a_dead_beat_s_ticks_are_missed(
    env: Env,
) -> None:
    env.engine.schedule("report", every=5)
    env.engine.run_schedules()
    env.clock.at(10)  # the pass that should have come at 5 came late
    late = env.engine.run_schedules(grace=10)
    assert [t - T0 for _, t, _ in late.started] == [5000, 10_000] and late.dropped == []
    env.clock.at(60)  # no pass for 50 s: beat was down, its ticks were missed
    down = env.engine.run_schedules(grace=10)
    assert [t - T0 for _, t, _ in down.started] == [60_000]  # the newest only (catch_up=0)
    assert down.dropped == [("report", 9)]


def test_a_tick_whose_run_a_dead_pass_started_is_that_run_whatever_overlap_says(
    env: Env,
) -> None:
    schedule = env.engine.schedule("slow", every=5)  # overlap="skip"
    env.engine.run_schedules()
    env.clock.at(5)
    [(_, _, first)] = env.engine.run_schedules().started  # still running at 10
    env.clock.at(10)
    # A pass started tick 10's run, then its worker died before recording it.
    orphan = env.engine.start("slow", None, idempotency_key=schedule.key(T0 + 10_000)).run_id
    report = env.engine.run_schedules()
    assert report.started == [("slow", T0 + 10_000, orphan)] and report.skipped == []
    assert env.engine.schedule_store.schedule_states()["slow"].last_run_id == orphan
    assert first != orphan
