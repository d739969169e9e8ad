"""One pass over the schedules: start every due tick's run, once.

What the beat entry ``pikku-schedules`` runs (on a worker), and what any
number of beats may run at once. "Now" is the store's clock. A tick's run is
started with the tick's idempotency key, so a second beat, a pass repeated
after a crash, or a restarted beat that sees the tick again gets the same
run back; the store's row only says how far the schedule got (which ticks
were missed while no beat ran) and never goes back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import chain

from ..errors import IdempotencyKeyReusedError, RunSettledError
from ..model.values import Operator
from .host import ScheduleHost
from .model import Overlap, Schedule, ScheduleState
from .store import ScheduleStore

log = logging.getLogger(__name__)

MAX_DROPPED_COUNTED = 1000
"""Missed ticks counted past ``catch_up`` before the count stops (a beat down
for a week on a per-second schedule need not walk every tick)."""


@dataclass
class ScheduleReport:
    """What one pass did: runs started (schedule, tick ms, run id), ticks
    skipped for overlap (schedule, tick ms), missed ticks dropped beyond
    ``catch_up`` (schedule, how many), and the schedules that failed (their
    error, logged)."""

    started: list[tuple[str, int, str]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    dropped: list[tuple[str, int]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def schedule_operator(name: str) -> Operator:
    """Who a schedule's cancel (``overlap="cancel_previous"``) is audited as."""
    return Operator(f"schedule:{name}")


def run_schedules(
    engine: ScheduleHost,
    schedules: Iterable[Schedule],
    store: ScheduleStore,
    grace_ms: int = 0,
) -> ScheduleReport:
    """Start the due ticks of every schedule (one failing schedule stops no other).

    The newest due tick, and any tick within ``grace_ms`` of now while the
    passes kept coming (a pass that came late, not a beat that was down),
    always start; older ticks were missed, and ``catch_up`` of them start,
    newest first kept.
    """
    report = ScheduleReport()
    listed = list(schedules)
    if not listed:
        return report
    now = store.now_ms()
    states = store.schedule_states()
    for schedule in listed:
        try:
            _tick(engine, schedule, store, states.get(schedule.name), now, grace_ms, report)
        except Exception as exc:
            log.exception("schedule %r could not start its tick", schedule.name)
            report.failed[schedule.name] = f"{type(exc).__name__}: {exc}"
    return report


def _tick(
    engine: ScheduleHost,
    schedule: Schedule,
    store: ScheduleStore,
    state: ScheduleState | None,
    now: int,
    grace_ms: int,
    report: ScheduleReport,
) -> None:
    spec = schedule.spec
    latest = spec.latest(now)
    if latest is None:
        return

    def noted(tick: int, run_id: str | None) -> ScheduleState:
        return ScheduleState(
            schedule.name,
            schedule.workflow,
            spec.describe(),
            tick,
            spec.next_after(tick),
            run_id,
            now,
        )

    if state is None:  # first seen: ticks from the next one on
        store.note_tick(noted(latest, None))
        return
    if latest <= state.last_tick_ms:
        return
    # Ticks within grace of now came late (a pass delayed by beat's jitter)
    # only while passes kept coming: after a beat that was down, every tick
    # but the newest was missed, and catch_up bounds them.
    passing = state.updated_at_ms >= now - grace_ms
    due: list[int] = []  # newest first
    missed = dropped = oldest_dropped = 0
    for tick in chain([latest], spec.before(latest)):
        if tick <= state.last_tick_ms or dropped >= MAX_DROPPED_COUNTED:
            break
        if tick == latest or (passing and tick > now - grace_ms):  # due now, or just late
            due.append(tick)
        elif missed < schedule.catch_up:
            missed += 1
            due.append(tick)
        else:
            dropped += 1
            oldest_dropped = tick
    if dropped and _started_before_its_note(engine, schedule, state, oldest_dropped):
        dropped -= 1
    if dropped:
        report.dropped.append((schedule.name, dropped))
        log.warning(
            "schedule %r: %s missed tick(s) dropped beyond catch_up=%d",
            schedule.name,
            f"{dropped}+" if dropped >= MAX_DROPPED_COUNTED else dropped,
            schedule.catch_up,
        )
    previous = state.last_run_id
    for tick in reversed(due):
        found = _run_of(engine, schedule, tick)  # a pass that died after starting it
        if found is not None:
            report.started.append((schedule.name, tick, found))
            store.note_tick(noted(tick, found))
            previous = found
            continue
        if previous is not None and not _may_start(engine, schedule, previous):
            report.skipped.append((schedule.name, tick))
            store.note_tick(noted(tick, None))
            continue
        try:
            run_id = engine.start(
                schedule.workflow, schedule.input, idempotency_key=schedule.key(tick)
            ).run_id
        except IdempotencyKeyReusedError as exc:  # the input changed since that tick ran
            run_id = exc.run_id
        report.started.append((schedule.name, tick, run_id))
        store.note_tick(noted(tick, run_id))
        previous = run_id


def _started_before_its_note(
    engine: ScheduleHost, schedule: Schedule, state: ScheduleState, tick: int
) -> bool:
    """Whether ``tick``, the one right after the recorded one, has a run: a
    pass that died between starting it and recording it. That tick ran, so it
    was not dropped. Only that one tick can be in this state (a pass records
    each tick before starting the next)."""
    return tick == schedule.spec.next_after(state.last_tick_ms) and (
        _run_of(engine, schedule, tick) is not None
    )


def _run_of(engine: ScheduleHost, schedule: Schedule, tick: int) -> str | None:
    """The run already started for ``tick`` (its idempotency key), if any: it
    is the tick's run whatever ``overlap`` would say now."""
    for run in engine.store.runs_with_key(schedule.key(tick), limit=5):
        if run.workflow == schedule.workflow:
            return run.id
    return None


def _may_start(engine: ScheduleHost, schedule: Schedule, previous: str) -> bool:
    """Whether a tick may start while ``previous`` (the last tick's run) may
    still run: always with ``allow``; with ``skip`` only once it ended; with
    ``cancel_previous`` after asking it to cancel."""
    if schedule.overlap == Overlap.ALLOW:
        return True
    run = engine.store.get_run(previous)
    if run is None or run.status.terminal:
        return True
    if schedule.overlap == Overlap.SKIP:
        return False
    if not run.cancel_requested:
        with suppress(RunSettledError):  # it ended meanwhile
            engine.cancel(run.id, by=schedule_operator(schedule.name))
    return True
