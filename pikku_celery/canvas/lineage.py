"""Which task started which: the ``root_id`` and ``parent_id`` Celery gives a canvas node.

Celery sends each task of a canvas from the one before it: a chain's next
task is sent by the task that ended the step before (its ``parent_id``), a
chord's body by the header member whose result completed the header (here:
the last member, one of those Celery may pick), a link by its task. Every
task sent from another keeps that one's ``root_id``; a task the caller sends
(the canvas's first, each member of a group it starts) is its own root, or,
when the caller is a task, has it as parent and its root. The plan names
every node's id, so the walk knows both before a node runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery._state import get_current_task

Node = dict[str, Any]
"""A plan node (:mod:`.plan`)."""

Lineage = tuple[str | None, str | None]
"""``(root_id, parent_id)`` a node is started under; ``(None, None)``: by
the caller, each task it starts being its own root."""

CALLER: Lineage = (None, None)


def caller_lineage() -> Lineage:
    """The lineage of a canvas started inside a task (``durable()``,
    ``self.replace``, ``self.add_to_chord``): that task as parent, and its
    root, as Celery's ``send_task`` gives them; :data:`CALLER` outside a
    task (or in one of pikku's own)."""
    task = get_current_task()
    request = getattr(task, "request", None)
    own = getattr(request, "id", None)
    if not isinstance(own, str) or str(getattr(task, "name", "")).startswith("pikku."):
        return CALLER
    root = getattr(request, "root_id", None)
    return (root if isinstance(root, str) else own, own)


Ids = Callable[[Node, str], str]
"""A task node's id (what its result and its request have) from its path."""


def task_lineage(own_id: str, lineage: Lineage) -> Lineage:
    """The ``(root_id, parent_id)`` of a task with ``own_id`` started under ``lineage``."""
    return (lineage[0] or own_id, lineage[1])


def after(node: Node, path: str, lineage: Lineage, ids: Ids) -> Lineage:
    """The lineage of what ``node`` (started under ``lineage``) starts once it
    ends: its ending task's root and that task as parent."""
    kind = node["t"]
    if kind == "task":
        own = ids(node, path)
        return (lineage[0] or own, own)
    if kind == "chain":
        for i, item in enumerate(node["items"]):
            lineage = after(item, f"{path}.{i}", lineage, ids)
        return lineage
    if kind == "group":
        first, member = int(node.get("first", 0)), node.get("member", "")
        items = node["items"]
        if not items:
            return lineage
        last = len(items) - 1
        return after(items[last], f"{path}.{member}{first + last}", lineage, ids)
    return after(node["body"], f"{path}.body", header_end(node, path, lineage, ids), ids)


def header_end(node: Node, path: str, lineage: Lineage, ids: Ids) -> Lineage:
    """The lineage a chord's body is started under: its header's last member's end."""
    header = node["header"]
    if not header:
        return lineage  # Celery calls the body at once
    last = len(header) - 1
    return after(header[last], f"{path}.h{last}", lineage, ids)


def result_ids(node: Node, path: str, ids: Ids) -> list[str]:
    """The result ids a node's result waits on: a task's own, a chain's last
    node's, a chord's body's, each member's of a group."""
    kind = node["t"]
    if kind == "task":
        return [ids(node, path)]
    if kind == "chain":
        last = len(node["items"]) - 1
        return result_ids(node["items"][last], f"{path}.{last}", ids)
    if kind == "chord":
        return result_ids(node["body"], f"{path}.body", ids)
    return [r for i, n in enumerate(node["items"]) for r in result_ids(n, f"{path}.{i}", ids)]


def node_extras(own_id: str, node: Node, lineage: Lineage) -> dict[str, Any]:
    """What a task node's request carries of its own: its root and parent
    ids, its stamps."""
    root_id, parent_id = task_lineage(own_id, lineage)
    extras: dict[str, Any] = {"root_id": root_id, "parent_id": parent_id}
    if node.get("stamps"):
        extras["stamps"] = node["stamps"]
    return extras
