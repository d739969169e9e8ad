"""``@pikku.schedule(...)``: a schedule checked whole when it is defined.

A bad spec, overlap, catch-up or input is refused at import, never at the
first tick on a worker.
"""

from __future__ import annotations

from datetime import timedelta

from ..model.values import JSON
from ..names import MAX_NAME_LENGTH, check_name
from .host import Named, ScheduleHost
from .model import Overlap, Schedule
from .spec import tick_spec


def define_schedule(
    engine: ScheduleHost,
    workflow: Named | str,
    *,
    every: float | timedelta | None,
    cron: str | None,
    input: JSON,
    overlap: Overlap | str,
    catch_up: int,
    name: str | None,
) -> Schedule:
    """The :class:`Schedule` of these arguments, registered on ``engine``."""
    workflow_name = workflow if isinstance(workflow, str) else workflow.name
    spec = tick_spec(every, cron)
    try:
        how = Overlap(overlap)
    except ValueError:
        choices = ", ".join(repr(o.value) for o in Overlap)
        raise ValueError(f"overlap={overlap!r} is not one of {choices}") from None
    if isinstance(catch_up, bool) or not isinstance(catch_up, int) or catch_up < 0:
        raise ValueError(f"catch_up= must be a whole number of ticks, 0 or more, not {catch_up!r}")
    # The name goes into each tick's idempotency key, beside the tick's time.
    schedule_name = check_name(name or workflow_name, "schedule name", MAX_NAME_LENGTH - 40)
    engine.check_input(input, f"schedule {schedule_name!r}", "input")
    if schedule_name in engine.schedules:
        raise ValueError(
            f"a schedule named {schedule_name!r} is already defined: give each schedule "
            "of a workflow its own name="
        )
    schedule = Schedule(schedule_name, workflow_name, spec, input, how, catch_up)
    engine.schedules[schedule_name] = schedule
    return schedule
