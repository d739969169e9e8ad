"""Durable schedules: a workflow started on every tick, once, across beats.

Pure over the engine and the :class:`ScheduleStore` port; the SQL adapter is
:mod:`.sql` (imported where a SQL engine is at hand, not here).
"""

from .model import Overlap, Schedule, ScheduleState
from .spec import Cron, Every, TickSpec
from .store import InMemoryScheduleStore, ScheduleStore
from .tick import ScheduleReport, run_schedules

__all__ = [
    "Cron",
    "Every",
    "InMemoryScheduleStore",
    "Overlap",
    "Schedule",
    "ScheduleReport",
    "ScheduleState",
    "ScheduleStore",
    "TickSpec",
    "run_schedules",
]
