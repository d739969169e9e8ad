"""A durable canvas's plan as a tree in ``runs show``: each node with its step's state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from rich.tree import Tree

from ..canvas.shape import canvas_rows
from ..engine.handle import StepHistory
from ..model.values import RunState
from .render import STATUS_STYLE


def canvas_tree(run: RunState, steps: Sequence[StepHistory]) -> Tree | None:
    """The plan of a ``pikku.canvas`` run as a tree (None if its input is no plan)."""
    rows = canvas_rows(run.input)
    if rows is None:
        return None
    by_name = {h.step.name: h for h in steps}
    tree = Tree(Text("canvas", style="bold"))
    branches: list[Tree] = [tree]
    for row in rows:
        label = Text(f"{row['role'] + ': ' if row['role'] else ''}{row['label']}")
        label.append(f"  {row['path']}", style="dim")
        if row["kind"] in ("task", "link_error"):
            _state(label, by_name.get(row["path"]))
        del branches[row["depth"] + 1 :]
        branches.append(branches[row["depth"]].add(label))
    return tree


def _state(label: Text, history: StepHistory | None) -> None:
    if history is None:
        label.append("  not started", style="dim")
        return
    step = history.step
    label.append(f"  {step.status.value}", style=STATUS_STYLE.get(step.status.value, ""))
    label.append(f" (attempt {step.attempt})", style="dim")
    if step.status.value == "succeeded":
        label.append(f" -> {_short(step.result)}")
    elif step.error:
        label.append(f" {step.error.get('type')}: {step.error.get('message')}", style="red")


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
