"""When a schedule ticks: a fixed interval or a cron expression, in epoch ms (UTC).

Tick times are a pure function of the spec, never of when a beat happened
to look: every beat (and every restart) computes the same ticks, so a tick
can name its run (its idempotency key) and two beats start it once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from croniter import croniter


class TickSpec(Protocol):
    """A schedule's tick times."""

    def latest(self, at_ms: int) -> int | None:
        """The newest tick at or before ``at_ms`` (None: none yet)."""
        ...

    def next_after(self, at_ms: int) -> int:
        """The first tick strictly after ``at_ms``."""
        ...

    def before(self, at_ms: int) -> Iterator[int]:
        """Ticks strictly before ``at_ms``, newest first."""
        ...

    def describe(self) -> str:
        """The spec as a person writes it (``every 5s``, ``cron */5 * * * *``)."""
        ...


@dataclass(frozen=True)
class Every:
    """A tick every ``ms`` milliseconds, at whole multiples of it since the
    Unix epoch (``every=60`` ticks on each minute, in UTC)."""

    ms: int

    def __post_init__(self) -> None:
        if self.ms < 1:
            raise ValueError(f"every= must be at least 1 ms, not {self.ms} ms")

    def latest(self, at_ms: int) -> int | None:
        """The newest multiple of the interval at or before ``at_ms``."""
        return at_ms - at_ms % self.ms

    def next_after(self, at_ms: int) -> int:
        """The first multiple of the interval after ``at_ms``."""
        return at_ms - at_ms % self.ms + self.ms

    def before(self, at_ms: int) -> Iterator[int]:
        """Multiples of the interval before ``at_ms``, newest first."""
        tick = self.next_after(at_ms - 1) - self.ms
        while tick >= 0:
            yield tick
            tick -= self.ms

    def describe(self) -> str:
        """``every 5s`` (seconds shown whole when whole)."""
        seconds = self.ms / 1000
        return f"every {seconds:g}s"


@dataclass(frozen=True)
class Cron:
    """A cron expression (five fields; a sixth, last, for seconds), in UTC,
    read by croniter (the ``cron`` extra: ``pip install 'pikku-celery[cron]'``)."""

    expression: str

    def __post_init__(self) -> None:
        if not _croniter().is_valid(self.expression):
            raise ValueError(f"cron={self.expression!r} is not a valid cron expression")

    def _iter(self, at_ms: int) -> croniter:
        return _croniter()(self.expression, datetime.fromtimestamp(at_ms / 1000, UTC))

    def latest(self, at_ms: int) -> int | None:
        """The newest tick at or before ``at_ms``."""
        return next(self.before(self.next_after(at_ms)), None)

    def next_after(self, at_ms: int) -> int:
        """The first tick after ``at_ms``."""
        return _ms(self._iter(at_ms).get_next(datetime))

    def before(self, at_ms: int) -> Iterator[int]:
        """Ticks before ``at_ms``, newest first."""
        ticks = self._iter(at_ms)
        while True:
            found = ticks.get_prev(datetime)
            if found.timestamp() < 0:
                return
            yield _ms(found)

    def describe(self) -> str:
        """``cron */5 * * * *``."""
        return f"cron {self.expression}"


def _ms(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def _croniter() -> type[croniter]:
    try:
        from croniter import croniter
    except ImportError:  # pragma: no cover - the extra is installed in tests
        raise ImportError(
            "cron= schedules need croniter: pip install 'pikku-celery[cron]'"
        ) from None
    return croniter


def tick_spec(every: float | timedelta | None, cron: str | None) -> TickSpec:
    """The spec of ``every=`` (seconds or a timedelta) or ``cron=``: exactly one."""
    if (every is None) == (cron is None):
        raise ValueError("a schedule takes exactly one of every= and cron=")
    if cron is not None:
        return Cron(cron)
    assert every is not None
    seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
    if not seconds > 0:
        raise ValueError(f"every= must be a positive interval, not {every!r}")
    return Every(round(seconds * 1000))
