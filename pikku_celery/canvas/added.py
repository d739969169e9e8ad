"""``self.add_to_chord(sig)`` inside a chord header member, made durable.

Celery adds ``sig`` to the running chord's header through the Redis result
backend's counter. Durably, the header member's step records what it added
beside its own result (an *addition marker*); the canvas interpreter starts
each addition as a child canvas run (``<node>~added<k>``) and joins its
result to the header's list after the members' own, so the body waits for it
and a worker killed midway loses nothing. Outside a chord header it raises
Celery's ``ValueError``, as Celery does.
"""

from __future__ import annotations

from typing import Any

from ..model.values import JSON

MARKER = "__pikku_added_to_chord__"
"""The key of a step result that carries additions to its chord's header."""

SUFFIX = "~added"
"""The step-name suffix (plus an index) of an addition's child run."""

NOT_IN_CHORD = "Current task is not member of any chord"
"""Celery's error for ``add_to_chord`` outside a chord."""


def with_additions(value: JSON, plans: list[JSON]) -> JSON:
    """A step result: ``value``, and these canvas plans added to the chord."""
    return {MARKER: {"value": value, "added": plans}}


def additions(result: Any) -> tuple[Any, list[Any]]:
    """``(value, plans)`` of a step result (no plans for a plain one)."""
    if isinstance(result, dict) and len(result) == 1 and MARKER in result:
        inner = result[MARKER]
        if isinstance(inner, dict) and isinstance(inner.get("added"), list):
            return inner.get("value"), inner["added"]
    return result, []
