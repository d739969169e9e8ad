"""The ``pikku.prune`` task and its beat entry ``pikku-prune``: retention on a schedule.

Installed by ``Pikku(app, retention=timedelta(days=30))``; without a retention
the task is still registered (a beat entry left from an older deploy finds
it) and prunes nothing. Each tick prunes for a bounded time under the prune
lease, so overlapping beats never prune at once and a backlog drains over
several ticks.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..engine.prune import TICK_SECONDS, retention_ms

if TYPE_CHECKING:
    from .integration import Pikku

PRUNE = "pikku.prune"
PRUNE_BEAT_ENTRY = "pikku-prune"
PRUNE_INTERVAL = 60.0
"""Seconds between the beat's prunes."""


def checked_retention(retention: timedelta | None) -> timedelta | None:
    """The retention as given, refused early when it is negative or not a timedelta."""
    if retention is None:
        return None
    if not isinstance(retention, timedelta):
        raise TypeError(f"retention must be a datetime.timedelta, not {retention!r}")
    retention_ms(retention)
    return retention


def install_retention(pikku: Pikku, install_beat: bool) -> None:
    """Register ``pikku.prune``; with a retention and ``install_beat``, its beat entry."""
    app = pikku.app

    @app.task(name=PRUNE, shared=False, serializer="json", ignore_result=True)
    def prune_task() -> dict[str, Any]:
        """Delete settled run trees older than the retention, for a bounded time."""
        return pikku.prune(time_budget=TICK_SECONDS).as_dict()

    pikku.prune_task = prune_task
    if install_beat and pikku.retention is not None:
        schedule = dict(app.conf.beat_schedule or {})
        schedule[PRUNE_BEAT_ENTRY] = {
            "task": PRUNE,
            "schedule": PRUNE_INTERVAL,
            "options": {"serializer": "json"},
        }
        app.conf.beat_schedule = schedule
