"""A durable canvas's ``AsyncResult`` tree, built from its stored plan as Celery builds it.

Celery links each result to the one before it: a chain's result has the
previous task's result as ``parent``, a group's is a ``GroupResult`` of its
members, a chord's is its body's result whose parent is the header's
``GroupResult``. The plan names every node and its task id, so the same
tree is built here, each node an ``AsyncResult`` (or ``GroupResult``) of its
id that the result backend answers once the node settles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.result import AsyncResult, GroupResult

from ..model.values import step_id_for
from .names import ROOT
from .plan import Node

Ids = Callable[[Node, str], str]


def canvas_tree(app: Celery, plan: Any, run_id: str) -> Any:
    """The result tree of ``plan`` (a run's input), as ``apply_async()``
    would have returned it; None for an input that is no plan."""
    root = plan.get("root") if isinstance(plan, dict) else None
    if not isinstance(root, dict):
        return None

    def ids(node: Node, path: str) -> str:
        chosen = node.get("id")
        return chosen if isinstance(chosen, str) else step_id_for(run_id, path)

    return _built(app, root, ROOT, ids, None)


def _built(app: Celery, node: Node, path: str, ids: Ids, parent: Any) -> Any:
    kind = node["t"]
    if kind == "task":
        return AsyncResult(ids(node, path), parent=parent, app=app)
    if kind == "chain":
        result = parent
        for i, item in enumerate(node["items"]):
            result = _built(app, item, f"{path}.{i}", ids, result)
        return result
    if kind == "group":
        members = [_built(app, n, f"{path}.{i}", ids, None) for i, n in enumerate(node["items"])]
        return GroupResult(_group_id(node, path, ids), members, parent=parent, app=app)
    header = [_built(app, n, f"{path}.h{i}", ids, None) for i, n in enumerate(node["header"])]
    group = GroupResult(ids({}, f"{path}.header"), header, parent=parent, app=app)
    return _built(app, node["body"], f"{path}.body", ids, group)


def _group_id(node: Node, path: str, ids: Ids) -> str:
    """A group's own id: the caller's (``group_id``, ``task_id``) or its path's."""
    chosen = node.get("id")
    return chosen if isinstance(chosen, str) else ids({}, path)
