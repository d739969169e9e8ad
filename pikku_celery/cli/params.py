"""The command line's parameter types: an age or an instant (``--since``,
``--older-than``), a runs-list cursor."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import click

from ..model.cursor import RunCursor
from .common import ParamTypeBase

AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d|w)\s*$", re.IGNORECASE)
AGE_MS = {"s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
AGE_MS.update({"d": 86_400_000, "w": 604_800_000})


@dataclass(frozen=True)
class Since:
    """``--since``: an instant (epoch ms) or an age before the store's now."""

    at_ms: int | None = None
    age_ms: int | None = None

    def resolve(self, now_ms: int) -> int:
        """The instant, in epoch ms, that ``--since`` means at ``now_ms``."""
        if self.at_ms is not None:
            return self.at_ms
        assert self.age_ms is not None
        return now_ms - self.age_ms


class SinceType(ParamTypeBase):
    """An ISO datetime (UTC unless it carries an offset) or an age like ``30m``."""

    name = "WHEN"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Since:
        """Parse an age (``90s``, ``1h``, ``2d``) or an ISO 8601 instant."""
        if isinstance(value, Since):
            return value
        text = str(value)
        match = AGE.match(text)
        if match:
            amount, unit = float(match.group(1)), match.group(2).lower()
            return Since(age_ms=round(amount * AGE_MS[unit]))
        try:
            when = datetime.fromisoformat(text.strip())
        except ValueError:
            self.fail(
                f"{text!r} is neither an ISO datetime (2024-05-01T12:00) "
                "nor an age (90s, 30m, 1h, 2d, 1w)",
                param,
                ctx,
            )
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return Since(at_ms=round(when.timestamp() * 1000))


class CursorType(ParamTypeBase):
    """A runs-list cursor (``<created_at>.<run id>``), as a page ends with."""

    name = "CURSOR"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> RunCursor:
        """Parse the cursor a listing printed."""
        if isinstance(value, RunCursor):
            return value
        try:
            return RunCursor.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
