"""A Celery canvas compiled into a plain JSON plan, checked whole before anything is stored.

The plan is the run's input: stored once in the run row, it is what every
orchestration pass interprets, so a canvas in flight never changes when the
code that built it does. Compiling applies Celery's own rewrites where they
change what runs (nested chains spliced, nested groups flattened, a
one-member group unrolled, a group followed by anything in a chain upgraded
to a chord), so the plan says exactly what Celery would have executed.

Plan nodes (``"t"`` is the kind):

- ``task``: ``task`` name, ``args``, ``kwargs``, ``immutable``, ``route``
  (queue, exchange, routing_key, priority), ``countdown``, ``attempts``,
  ``retry_delay``, ``link`` (nodes run with the result) and ``errbacks``;
  ``stamps`` (Celery's stamping API: header name to value, its own or
  those of the composites around it, see :mod:`.stamps`) when it has any;
- ``chain``: ``items``; ``group``: ``items``; ``chord``: ``header``, ``body``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import partial
from typing import Any

from celery import Celery
from celery.canvas import Signature, chord
from celery.utils.functional import arity_greater

from ..errors import CanvasError, UnknownTaskError
from ..names import check_name
from ..payload import check_json
from .lineage import CALLER, caller_lineage
from .names import ERRBACK_TASK, FAIL_UNRUN_TASK, ROOT
from .node_rules import check_arguments
from .stamps import STAMPED_HEADERS, Stamps, stamps_of
from .wire import encoded

PLAN_VERSION = 1

TAKEOVERS = 2
"""Attempts a node has beyond its task's own retries, for workers that die under it."""

UNBOUNDED_RETRIES = 100
"""The retries of a task whose ``max_retries`` is None (Celery: no limit)."""

ROUTE_OPTIONS = ("queue", "exchange", "routing_key", "priority")
FROZEN_OPTIONS = {"task_id", "root_id", "parent_id", "reply_to", "group_id", "group_index", "chord"}
"""What ``freeze()`` (or ``apply_async(task_id=...)``) sets: the ``task_id`` is
kept as the node's result id, the rest describe a tree the plan holds itself."""

MAPS = ("celery.starmap", "celery.map")
"""Celery's own tasks that call a task for each item of a list (``xstarmap``, ``xmap``)."""
CHUNKS = "celery.chunks"

DELAY_OPTIONS = {"countdown", "eta"}
LIMIT_OPTIONS = {"time_limit", "soft_time_limit"}
TASK_OPTIONS = {
    *ROUTE_OPTIONS,
    *FROZEN_OPTIONS,
    *DELAY_OPTIONS,
    *LIMIT_OPTIONS,
    "link",
    "link_error",
    "immutable",
}
COMPOSITE_OPTIONS = {*FROZEN_OPTIONS, *DELAY_OPTIONS, "link", "link_error"}

Node = dict[str, Any]


def compile_plan(app: Celery, signature: Any, task_id: str | None = None) -> dict[str, Any]:
    """The JSON plan of ``signature``; :class:`CanvasError` for what cannot
    run. ``task_id``: the id its result gets, unless the caller gave one."""
    if not isinstance(signature, Signature):
        raise CanvasError(
            f"durable() takes a Celery signature, chain, group or chord, got {signature!r}"
        )
    root = _Compiler(app).node(signature, ROOT)
    _give_id(root, task_id, ROOT)
    _check_calls(app, root, ROOT, fed=False)
    plan: dict[str, Any] = {"pikku_canvas": PLAN_VERSION, "root": root}
    lineage = caller_lineage()  # started inside a task: its root and it as parent
    if lineage != CALLER:
        plan["lineage"] = list(lineage)
    return plan


def _check_calls(app: Celery, node: Node, path: str, *, fed: bool) -> None:
    """Check, as ``apply_async`` does, the arguments of every node whose
    arguments are known now: one nothing is prepended to (``fed`` is False),
    or an immutable one. A call its task cannot take is refused here."""
    kind = node["t"]
    if kind == "task":
        if not fed or node["immutable"]:
            try:
                check_arguments(app.tasks[node["task"]], node["args"], node["kwargs"])
            except TypeError as exc:
                message = f"{path}: {node['task']} cannot take its arguments: {exc}"
                raise CanvasError(message) from None
        for i, link in enumerate(node["link"]):
            _check_calls(app, link, f"{path}.link{i}", fed=True)
    elif kind == "chain":
        for i, item in enumerate(node["items"]):
            _check_calls(app, item, f"{path}.{i}", fed=fed or i > 0)
    elif kind == "group":
        for i, item in enumerate(node["items"]):
            _check_calls(app, item, f"{path}.{i}", fed=fed)
    else:
        for i, item in enumerate(node["header"]):
            _check_calls(app, item, f"{path}.h{i}", fed=fed)
        _check_calls(app, node["body"], f"{path}.body", fed=True)


class _Compiler:
    def __init__(self, app: Celery) -> None:
        self.app = app
        self.open: set[int] = set()  # signatures being compiled: a link back is a cycle
        self.stamps = Stamps()  # those of the composites being compiled

    def node(self, sig: Any, path: str) -> Node:
        if isinstance(sig, dict) and not isinstance(sig, Signature):
            sig = self.app.signature(sig)
        if not isinstance(sig, Signature):
            raise CanvasError(f"{path}: {sig!r} is not a Celery signature")
        if id(sig) in self.open:
            raise CanvasError(
                f"{path}: the canvas links back to {sig!r}, a cycle that would never end"
            )
        self.open.add(id(sig))
        try:
            kind = sig.subtask_type  # Celery's own tag: chain, group, chord or None
            if kind is None and sig.task == CHUNKS:
                node = self.node(_chunks_group(sig), path)
            elif kind is None and sig.task in MAPS:
                node = self.task(sig, path, mapped=True)
            elif kind in ("chain", "group", "chord"):
                with self.stamps.around(stamps_of(sig, path)):
                    node = getattr(self, kind)(sig, path)
            elif kind is not None:
                raise CanvasError(f"{path}: a {kind} canvas is not supported durably")
            else:
                node = self.task(sig, path)
            return node
        finally:
            self.open.discard(id(sig))

    # --- composites ------------------------------------------------------------
    def chain(self, sig: Signature, path: str) -> Node:
        self.composite_options(sig, path)
        steps = _spliced(list(sig.tasks))
        if not steps:
            raise CanvasError(f"{path}: an empty chain has nothing to run")
        items: list[Any] = []
        for step in steps:
            if items and _is(items[-1], "group"):
                # Celery's automatic upgrade: group(...) | s is chord(group, s).
                items[-1] = chord(items[-1], body=step, app=self.app)
            else:
                items.append(step)
        if len(items) == 1:
            node = self.node(items[0], path)
        else:
            node = {
                "t": "chain",
                "items": [self.node(s, f"{path}.{i}") for i, s in enumerate(items)],
            }
        _give_id(node, sig.options.get("task_id"), path)  # a chain's id is its last task's
        return self.composite_callbacks(sig, node, path)

    def group(self, sig: Signature, path: str) -> Node:
        self.composite_options(sig, path)
        members = _flattened(sig)
        if len(members) == 1 and not sig.options and _ends_in_group(members[0]):
            # Celery's special case: a group of one chain that ends in a
            # group gives that group's results, not a list of them.
            return self.node(members[0], path)
        node: Node = {
            "t": "group",
            "items": [self.node(s, f"{path}.{i}") for i, s in enumerate(members)],
        }
        _give_id(node, sig.options.get("task_id") or sig.options.get("group_id"), path)
        return self.composite_callbacks(sig, node, path)

    def chord(self, sig: Signature, path: str) -> Node:
        self.composite_options(sig, path)
        header = sig.tasks
        members = _flattened(header) if _is(header, "group") else _flat_list(header)
        if sig.body is None:
            raise CanvasError(f"{path}: a chord needs a body")
        node: Node = {
            "t": "chord",
            "header": [self.node(s, f"{path}.h{i}") for i, s in enumerate(members)],
            "body": self.node(sig.body, f"{path}.body"),
        }
        _give_id(node["body"], sig.options.get("task_id"), path)  # a chord's id is its body's
        return self.composite_callbacks(sig, node, path)

    def composite_options(self, sig: Signature, path: str) -> None:
        unknown = sorted(set(sig.options) - COMPOSITE_OPTIONS - _stamp_options(sig))
        if unknown:
            raise CanvasError(
                f"{path}: option(s) {', '.join(unknown)} on a {sig.subtask_type} are not "
                "supported durably; set them on its tasks"
            )

    def composite_callbacks(self, sig: Signature, node: Node, path: str) -> Node:
        """A composite's own ``link``/``link_error`` options, placed as Celery
        places them; its ``countdown``/``eta`` delays the tasks it starts with."""
        delay = _delay(sig, path)
        if delay:
            _delay_entry(node, delay)
        for i, link in enumerate(_listed(sig.options.get("link"))):
            _attach_link(node, self.node(link, f"{path}.link{i}"), immutable=False)
        for errback in _listed(sig.options.get("link_error")):
            _attach_errback(node, errback, self, header=self.header_errbacks(sig))
        return node

    def header_errbacks(self, sig: Signature) -> bool:
        """``task_allow_error_cb_on_chord_header`` of the app the canvas was
        made with (the one Celery would read when it is applied)."""
        app = sig.app or self.app
        return bool(app.conf.task_allow_error_cb_on_chord_header)

    # --- tasks -------------------------------------------------------------------
    def task(self, sig: Signature, path: str, *, mapped: bool = False) -> Node:
        """A task node; ``mapped``: Celery's ``starmap``/``map`` of a task
        over a list, one node as in Celery (its own task calls the task for
        each item, in one message), the task it maps checked as a node's."""
        if mapped:
            name = sig.task
            inner = sig.kwargs.get("task")
            inner_name = inner.get("task") if isinstance(inner, dict) else None
            self.task_name(inner_name, path)
            if not isinstance(sig.kwargs.get("it"), (list, tuple)):
                sig = sig.clone()
                sig.kwargs["it"] = list(sig.kwargs.get("it") or [])  # a lazy list, taken whole
        else:
            name = self.task_name(sig.task, path)
        unknown = sorted(set(sig.options) - TASK_OPTIONS - _stamp_options(sig))
        if unknown:
            raise CanvasError(
                f"{path}: option(s) {', '.join(unknown)} of {name!r} are not supported "
                f"durably (supported: {', '.join(sorted(TASK_OPTIONS))})"
            )
        args, kwargs = encoded(list(sig.args)), encoded(dict(sig.kwargs))
        check_json(args, f"canvas node {path} ({name})", "args")
        check_json(kwargs, f"canvas node {path} ({name})", "kwargs")
        route: dict[str, Any] = {}
        for key in ("queue", "exchange", "routing_key"):
            value = sig.options.get(key)
            if value is not None:
                route[key] = check_name(value, f"{path}: {key}")
        priority = sig.options.get("priority")
        if priority is not None:
            if (
                not isinstance(priority, int)
                or isinstance(priority, bool)
                or not 0 <= priority <= 255
            ):
                raise CanvasError(f"{path}: priority must be an int 0-255, got {priority!r}")
            route["priority"] = priority
        countdown = _delay(sig, path)
        for key in LIMIT_OPTIONS:
            limit = sig.options.get(key)
            if limit is not None:
                if not isinstance(limit, (int, float)) or not limit > 0:
                    raise CanvasError(f"{path}: {key} must be a positive number of seconds")
                route[key] = float(limit)
        task = self.app.tasks[name]
        retries = task.max_retries if task.max_retries is not None else UNBOUNDED_RETRIES
        node: Node = {
            "t": "task",
            "task": name,
            "args": args,
            "kwargs": kwargs,
            "immutable": bool(sig.immutable or sig.options.get("immutable")),
            "route": route,
            "countdown": countdown,
            "attempts": int(retries) + 1 + TAKEOVERS,
            "retry_delay": float(task.default_retry_delay or 0),
            "link": [],
            "errbacks": [],
        }
        stamps = self.stamps.of_task(stamps_of(sig, path))
        if stamps:
            node["stamps"] = stamps
        _give_id(node, sig.options.get("task_id"), path)
        for i, link in enumerate(_listed(sig.options.get("link"))):
            node["link"].append(self.node(link, f"{path}.link{i}"))
        for errback in _listed(sig.options.get("link_error")):
            node["errbacks"].append(self.errback(errback, path, len(node["errbacks"])))
        return node

    def errback(self, errback: Any, path: str, index: int) -> Node:
        if isinstance(errback, dict) and not isinstance(errback, Signature):
            errback = self.app.signature(errback)
        if not isinstance(errback, Signature) or errback.subtask_type is not None:
            raise CanvasError(
                f"{path}: link_error {errback!r} must be a task signature "
                "(a chain, group or chord as an errback is not supported durably)"
            )
        name = self.task_name(errback.task, f"{path}.err{index}")
        args, kwargs = encoded(list(errback.args)), encoded(dict(errback.kwargs))
        check_json(args, f"errback of canvas node {path}", "args")
        check_json(kwargs, f"errback of canvas node {path}", "kwargs")
        return {
            "task": name,
            "args": args,
            "kwargs": kwargs,
            "immutable": bool(errback.immutable),
            "new_style": _new_style_errback(self.app, errback),
        }

    def task_name(self, name: Any, path: str) -> str:
        if not isinstance(name, str) or name not in self.app.tasks:
            raise UnknownTaskError(
                f"{path}: task {name!r} is not registered with Celery app {self.app.main!r}"
            )
        if name.startswith(("celery.", "pikku.")) or name in (ERRBACK_TASK, FAIL_UNRUN_TASK):
            raise CanvasError(f"{path}: {name!r} is a built-in task, not a canvas node")
        return name


def _stamp_options(sig: Signature) -> set[str]:
    """The options Celery's stamping API set on ``sig``: its stamps' names
    and the list of them."""
    names = sig.options.get(STAMPED_HEADERS)
    if not names:
        return set()
    return {STAMPED_HEADERS, *(n for n in _listed(names) if isinstance(n, str))}


def _chunks_group(sig: Signature) -> Signature:
    """``task.chunks(it, n)`` as Celery applies it: a group of ``starmap``s
    of ``n`` items each, with the chunks' own options."""
    grouped = sig.group()
    grouped.options.update(sig.options)
    return grouped


def _new_style_errback(app: Celery, errback: Signature) -> bool:
    """Celery's rule: an errback whose function takes more than one argument
    beyond those it already holds is called ``(request, exc, traceback)``,
    else it is sent the failed task's id."""
    task = app.tasks[errback.task]
    header = getattr(task, "__header__", None)
    if header is None or isinstance(header, partial):
        return False
    if not errback.immutable and (errback.args or errback.kwargs):
        try:
            return bool(arity_greater(partial(header, *errback.args, **errback.kwargs), 1))
        except (TypeError, ValueError):
            pass
    return bool(arity_greater(header, 1))


def _delay(sig: Signature, path: str) -> float | None:
    """``countdown`` (seconds) or ``eta`` (a datetime, or its ISO text) as
    seconds from now; None for neither."""
    countdown = sig.options.get("countdown")
    eta = sig.options.get("eta")
    if countdown is None and eta is not None:
        if isinstance(eta, str):
            try:
                eta = datetime.fromisoformat(eta)
            except ValueError:
                raise CanvasError(f"{path}: eta {eta!r} is not an ISO date and time") from None
        if not isinstance(eta, datetime):
            raise CanvasError(f"{path}: eta must be a datetime, got {eta!r}")
        aware = eta if eta.tzinfo else eta.replace(tzinfo=UTC)
        countdown = (aware - datetime.now(UTC)).total_seconds()
    if countdown is None:
        return None
    if not isinstance(countdown, (int, float)) or not math.isfinite(countdown):
        raise CanvasError(f"{path}: countdown must be a number of seconds")
    return max(0.0, float(countdown))


def _delay_entry(node: Node, seconds: float) -> None:
    """Delay the tasks a composite starts with (a chain's first, a group's
    members, a chord's header), as ``apply_async(countdown=)`` on it does."""
    kind = node["t"]
    if kind == "task":
        node["countdown"] = max(node["countdown"] or 0.0, seconds)
    elif kind == "chain":
        _delay_entry(node["items"][0], seconds)
    else:
        for item in node["items" if kind == "group" else "header"]:
            _delay_entry(item, seconds)


def _give_id(node: Node, task_id: Any, path: str) -> None:
    """Give the node whose result a composite returns the caller's id for it
    (a frozen signature's, ``task_id=``), unless that node has its own."""
    if task_id is None:
        return
    check_name(task_id, f"{path}: task_id")
    while node["t"] in ("chain", "chord"):
        node = node["items"][-1] if node["t"] == "chain" else node["body"]
    node.setdefault("id", task_id)


def result_node(node: Node) -> tuple[Node, str] | None:
    """The task node whose result a canvas returns (the last task of a
    chain, a chord's body) and its path; None when it returns a group's list."""
    path = ROOT
    while node["t"] in ("chain", "chord"):
        if node["t"] == "chain":
            path, node = f"{path}.{len(node['items']) - 1}", node["items"][-1]
        else:
            path, node = f"{path}.body", node["body"]
    return (node, path) if node["t"] == "task" else None


def _listed(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _spliced(steps: list[Any]) -> list[Any]:
    """A chain's steps with nested chains spliced in and empty groups dropped."""
    out: list[Any] = []
    for step in steps:
        if _is(step, "chain"):
            if step.options:
                out.append(step)  # keeps its own link/link_error: compiled as a node
            else:
                out.extend(_spliced(list(step.tasks)))
        elif _is(step, "group") and not step.options and len(_flattened(step)) < 2:
            # Celery unrolls a one-member group in a chain, and drops an empty one.
            out.extend(_spliced(_flattened(step)))
        else:
            out.append(step)
    return out


def _ends_in_group(sig: Any) -> bool:
    if not _is(sig, "chain") or not sig.tasks:
        return False
    last = list(sig.tasks)[-1]
    return _is(last, "group") or _ends_in_group(last)


def _is(sig: Any, kind: str) -> bool:
    """Whether ``sig`` is a signature of Celery's ``kind`` (its public ``subtask_type``)."""
    return isinstance(sig, Signature) and sig.subtask_type == kind


def _flattened(sig: Signature) -> list[Any]:
    """A group's members with nested groups flattened in (as Celery applies them)."""
    return _flat_list(sig.tasks)


def _flat_list(tasks: Any) -> list[Any]:
    out: list[Any] = []
    for task in list(tasks or []):
        if _is(task, "group") and not task.options:
            out.extend(_flattened(task))
        elif _is(task, "chain") and not task.tasks:
            continue
        else:
            out.append(task)
    return out


def _attach_link(node: Node, link: Node, *, immutable: bool) -> None:
    """Celery's placement of a link on a composite: a chain's last step, a
    group's first member (made immutable), a chord's body."""
    kind = node["t"]
    if kind == "task":
        node["link"].append(_immutable(link) if immutable else link)
    elif kind == "chain":
        _attach_link(node["items"][-1], link, immutable=immutable)
    elif kind == "group":
        _attach_link(node["items"][0], link, immutable=True)
    else:
        _attach_link(node["body"], link, immutable=immutable)


def _immutable(node: Node) -> Node:
    if node["t"] == "task":
        return {**node, "immutable": True}
    if node["t"] == "chain":
        return {**node, "items": [_immutable(node["items"][0]), *node["items"][1:]]}
    if node["t"] == "group":
        return {**node, "items": [_immutable(n) for n in node["items"]]}
    return {**node, "header": [_immutable(n) for n in node["header"]]}


def _attach_errback(node: Node, errback: Any, compiler: _Compiler, *, header: bool) -> None:
    """Celery's placement of an errback on a composite: every step of a chain,
    every member of a group, a chord's body (and header when
    ``task_allow_error_cb_on_chord_header`` is set)."""
    kind = node["t"]
    if kind == "task":
        node["errbacks"].append(compiler.errback(errback, "errback", len(node["errbacks"])))
    elif kind in ("chain", "group"):
        if kind == "chain":
            # Kept on the chain too: a chord whose header failed calls the
            # errbacks of its chain body, never run, from there.
            errbacks = node.setdefault("errbacks", [])
            errbacks.append(compiler.errback(errback, "errback", len(errbacks)))
        for item in node["items"]:
            _attach_errback(item, errback, compiler, header=header)
    else:
        if header:
            for item in node["header"]:
                _attach_errback(item, errback, compiler, header=header)
        _attach_errback(node["body"], errback, compiler, header=header)
