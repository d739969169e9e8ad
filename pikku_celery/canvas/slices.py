"""A large group run as child runs of slices of its members, so a pass costs a slice, not the group.

Every orchestration pass of a run reads the run's steps. A group of a
thousand members run as a thousand steps of one run would read a thousand
rows after each member settles: the group's cost would grow with the square
of its size. Above :data:`SLICE_ABOVE` members, the canvas starts the group
as child canvas runs (``<group>~part<k>``), each running a contiguous slice
of the members under their own paths and task ids (those of the run the
canvas was started as), and joins their lists in order: a member's pass reads
its slice, and the group's pass reads one step per slice.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..engine.replacement import unwrapped
from .evaluate import PENDING, SLICE_ABOVE, Done, Failed, Outcome, Pending
from .lineage import CALLER, Lineage
from .plan import PLAN_VERSION, Node

SUFFIX = "~part"
"""The step-name suffix (plus an index) of a slice's child run."""

MOST_SLICES = 40
"""The most child runs one group is cut into (a run's children are bounded)."""

_STEP = re.compile(r"step '([^']+)' failed: ")


def slice_size(members: int) -> int:
    """Members per slice: :data:`SLICE_ABOVE`, or more for a group so large
    it would need more than :data:`MOST_SLICES` children."""
    return max(SLICE_ABOVE, math.ceil(members / MOST_SLICES))


def slice_plans(
    node: Node, path: str, prepend: list[Any] | None, ids: str, lineage: Lineage = CALLER
) -> list[dict[str, Any]]:
    """The child plans of a group's slices: each a group of its members
    (``first``: the index of its first member in the whole group; ``member``:
    the prefix of its members' paths, ``h`` in a chord's header), under the
    group's ``path``, fed ``prepend``, its task ids those of run ``ids``,
    started under the group's ``lineage``."""
    items, first = node["items"], int(node.get("first", 0))
    size = slice_size(len(items))
    return [
        {
            "pikku_canvas": PLAN_VERSION,
            "root": {
                "t": "group",
                "items": items[start : start + size],
                "first": first + start,
                "member": node.get("member", ""),
                "whole": True,  # a slice is never cut again
            },
            "path": path,
            "prepend": prepend,
            "ids": ids,
            **({"lineage": list(lineage)} if lineage != CALLER else {}),
        }
        for start in range(0, len(items), size)
    ]


def slice_outcome(child: Outcome) -> Outcome:
    """A slice's outcome as its failed member's own: the member's step name
    and error, not the child run's wrapper around them."""
    if not isinstance(child, Failed) or child.error.get("type") != "StepFailedError":
        return child
    names = _STEP.findall(str(child.error.get("message", "")))
    kind, message, trace = unwrapped(child.error)
    step = names[-1] if names else child.step
    return Failed(step, {"type": kind, "message": message, "traceback": trace})


def joined_slices(outcomes: list[Outcome]) -> Outcome:
    """The group's outcome from its slices': pending while any is, else the
    first failure in order, else their lists one after the other."""
    if any(isinstance(o, Pending) for o in outcomes):
        return PENDING
    values: list[Any] = []
    for o in outcomes:
        if isinstance(o, Failed):
            return o
        assert isinstance(o, Done)
        values.extend(o.value)
    return Done(values)


def most_per_run(node: Node) -> tuple[int, int]:
    """The most steps and the most slice child runs any one run of ``node``
    records: the canvas's own run, or the run of one of its large groups'
    slices (each a step of the run that holds the group)."""
    (steps, slices), (inner_steps, inner_slices) = _bounds(node)
    return max(steps, inner_steps), max(slices, inner_slices)


Bounds = tuple[tuple[int, int], tuple[int, int]]
"""``((steps, slices), (steps, slices))``: what the run holding a node records
for it, and the most any run below it (a slice's) records."""


def _bounds(node: Node) -> Bounds:
    kind = node["t"]
    if kind == "task":
        own = 1 + (1 if node["countdown"] else 0) + len(node["errbacks"])
        return _summed([((own, 0), (0, 0)), *(_bounds(n) for n in node["link"])])
    if kind == "chain":
        parts = [_bounds(n) for n in node["items"]]
        return _summed([((len(node.get("errbacks", [])), 0), (0, 0)), *parts])
    members = node["items" if kind == "group" else "header"]
    extra = [((len(node.get("errbacks", [])), 0), (0, 0))]
    if kind == "chord":
        extra.append(_bounds(node["body"]))
    if len(members) <= SLICE_ABOVE:
        return _summed([*extra, *(_bounds(n) for n in members)])
    size = slice_size(len(members))
    count = math.ceil(len(members) / size)
    inner = (0, 0)
    for start in range(0, len(members), size):
        (held, below) = _summed([_bounds(n) for n in members[start : start + size]])
        inner = (max(inner[0], held[0], below[0]), max(inner[1], held[1], below[1]))
    return _summed([*extra, ((count, count), inner)])


def _summed(parts: list[Bounds]) -> Bounds:
    """Parts held by one run: their own counts add up, the runs below are apart."""
    own = (sum(p[0][0] for p in parts), sum(p[0][1] for p in parts))
    below = (max((p[1][0] for p in parts), default=0), max((p[1][1] for p in parts), default=0))
    return own, below
