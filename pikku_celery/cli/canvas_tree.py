"""A durable canvas's plan as a tree in ``runs show``: each node with its step's state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from rich.text import Text
from rich.tree import Tree

from ..canvas.plan import ROOT, Node
from ..engine.handle import StepHistory
from ..store.model import RunState
from .render import STATUS_STYLE


def canvas_tree(run: RunState, steps: Sequence[StepHistory]) -> Tree | None:
    """The plan of a ``pikku.canvas`` run as a tree (None if its input is no plan)."""
    plan = run.input
    if not isinstance(plan, dict) or not isinstance(plan.get("root"), dict):
        return None
    by_name = {h.step.name: h for h in steps}
    tree = Tree(Text("canvas", style="bold"))
    _add(tree, plan["root"], ROOT, by_name, "")
    return tree


def _add(parent: Tree, node: Node, path: str, steps: dict[str, StepHistory], role: str) -> None:
    kind = node.get("t")
    if kind == "task":
        branch = parent.add(_task_label(node, path, steps, role))
        for i, link in enumerate(node.get("link", [])):
            _add(branch, link, f"{path}.link{i}", steps, "link")
        for i, errback in enumerate(node.get("errbacks", [])):
            branch.add(_task_label(errback, f"{path}.err{i}", steps, "link_error"))
        return
    label = Text(f"{role + ': ' if role else ''}{kind}", style="bold")
    label.append(f"  {path}", style="dim")
    branch = parent.add(label)
    if kind in ("chain", "group"):
        for i, item in enumerate(node["items"]):
            _add(branch, item, f"{path}.{i}", steps, "")
    elif kind == "chord":
        for i, item in enumerate(node["header"]):
            _add(branch, item, f"{path}.h{i}", steps, "header")
        _add(branch, node["body"], f"{path}.body", steps, "body")


def _task_label(node: Node, path: str, steps: dict[str, StepHistory], role: str) -> Text:
    args = ", ".join(_short(a) for a in node.get("args", []))
    kwargs = ", ".join(f"{k}={_short(v)}" for k, v in node.get("kwargs", {}).items())
    signature = f"{node.get('task')}({', '.join(p for p in (args, kwargs) if p)})"
    if node.get("immutable"):
        signature += " immutable"
    label = Text(f"{role + ': ' if role else ''}{signature}")
    label.append(f"  {path}", style="dim")
    history = steps.get(path)
    if history is None:
        label.append("  not started", style="dim")
        return label
    status = history.step.status.value
    label.append(f"  {status}", style=STATUS_STYLE.get(status, ""))
    label.append(f" (attempt {history.step.attempt})", style="dim")
    if history.step.status.value == "succeeded":
        label.append(f" -> {_short(history.step.result)}")
    elif history.step.error:
        error = history.step.error
        label.append(f" {error.get('type')}: {error.get('message')}", style="red")
    return label


def _short(value: Any, limit: int = 40) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
