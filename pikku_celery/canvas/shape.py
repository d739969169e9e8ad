"""A stored canvas plan as rows of nodes, for the run page and ``runs show``."""

from __future__ import annotations

import json
from typing import Any

from .names import ROOT

Node = dict[str, Any]


def walk(node: Node) -> list[tuple[str, Node]]:
    """Every node of a plan under ``node`` with its path, depth first."""
    return [(path, n) for path, n, _, _ in _walk(node, ROOT, 0, "")]


def canvas_rows(plan: Any) -> list[dict[str, Any]] | None:
    """The plan's nodes in tree order: ``path`` (the node's step name),
    ``depth``, ``kind`` (task, chain, group, chord, link_error), ``role``
    (header, body, link or ""), ``label`` (a task's call as written). None
    for an input that is no plan."""
    if not isinstance(plan, dict) or not isinstance(plan.get("root"), dict):
        return None
    rows = []
    for path, node, depth, role in _walk(plan["root"], str(plan.get("path") or ROOT), 0, ""):
        kind = node.get("t", "link_error")
        rows.append(
            {
                "path": path,
                "depth": depth,
                "kind": kind,
                "role": role,
                "label": task_label(node) if kind in ("task", "link_error") else kind,
            }
        )
    return rows


def task_label(node: Node) -> str:
    """``task(args, kw=...)`` as the node was written (its partial arguments)."""
    args = [_short(a) for a in node.get("args", [])]
    args += [f"{k}={_short(v)}" for k, v in node.get("kwargs", {}).items()]
    label = f"{node.get('task')}({', '.join(args)})"
    return label + (" immutable" if node.get("immutable") else "")


def _walk(node: Node, path: str, depth: int, role: str) -> Any:
    yield path, node, depth, role
    kind = node.get("t")
    if kind in ("chain", "group"):
        # A large group's slice (its own run) numbers its members as the group does.
        first, member = int(node.get("first", 0)), node.get("member", "")
        role = "header" if member == "h" else ""
        for i, item in enumerate(node["items"]):
            yield from _walk(item, f"{path}.{member}{first + i}", depth + 1, role)
        for i, errback in enumerate(node.get("errbacks", [])):
            yield f"{path}.err{i}", errback, depth + 1, "link_error"
    elif kind == "chord":
        for i, item in enumerate(node["header"]):
            yield from _walk(item, f"{path}.h{i}", depth + 1, "header")
        yield from _walk(node["body"], f"{path}.body", depth + 1, "body")
    elif kind == "task":
        for i, link in enumerate(node.get("link", [])):
            yield from _walk(link, f"{path}.link{i}", depth + 1, "link")
        for i, errback in enumerate(node.get("errbacks", [])):
            yield f"{path}.err{i}", errback, depth + 1, "link_error"


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
