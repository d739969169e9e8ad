"""Stored values a body would be handed: refused when they are not JSON."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import CorruptValueError
from ..model.values import RunView, StepState
from ..payload import UnreadableValue


def check_readable(view: RunView) -> None:
    """Refuse to replay over a stored value that is not JSON (an edited row, or
    one nested too deep to decode), naming its run, step and column, rather
    than hand the body a stand-in."""
    check_values([view.run.input, *view.signals.values()])
    check_steps(view.steps)


def check_steps(steps: Iterable[StepState]) -> None:
    """:func:`check_readable` for some steps only (those a resumed body reads)."""
    for step in steps:
        check_values((step.result, step.error, step.args, step.kwargs))


def check_values(values: Iterable[object]) -> None:
    """Raise :class:`CorruptValueError` for the first value that is not JSON."""
    for value in values:
        if isinstance(value, UnreadableValue):
            raise CorruptValueError(f"{value.where} holds invalid JSON {value.text[:200]!r}")
