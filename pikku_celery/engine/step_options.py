"""What a ctx call is given, checked: durations, step timeouts, routing options."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from ..model.values import JSON
from ..names import check_name


def seconds(value: float | timedelta) -> float:
    """A duration in seconds; refused unless finite and not negative."""
    secs = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not math.isfinite(secs) or secs < 0:
        raise ValueError(f"a duration must be a finite number of seconds >= 0, got {value!r}")
    return secs


def timeout_ms(step: str, timeout: float | timedelta) -> int:
    """``ctx.step(timeout=)`` in milliseconds; refused unless positive."""
    secs = seconds(timeout)
    if not secs > 0:
        raise ValueError(f"step {step!r}: timeout must be more than 0 seconds, got {timeout!r}")
    return max(1, round(secs * 1000))


def route_options(
    step: str, queue: Any, exchange: Any, routing_key: Any, priority: Any
) -> dict[str, JSON]:
    """``ctx.step``'s routing options, checked: names are names, a priority 0-255."""
    route: dict[str, JSON] = {}
    for key, value in (("queue", queue), ("exchange", exchange), ("routing_key", routing_key)):
        if value is not None:
            route[key] = check_name(value, f"step {step!r}: {key}")
    if priority is not None:
        if not isinstance(priority, int) or isinstance(priority, bool) or not 0 <= priority <= 255:
            raise ValueError(f"step {step!r}: priority must be an int 0-255, got {priority!r}")
        route["priority"] = priority
    return route
