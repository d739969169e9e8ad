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
- ``chain``: ``items``; ``group``: ``items``; ``chord``: ``header``, ``body``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from celery import Celery
from celery.canvas import Signature, chord
from celery.utils.functional import arity_greater

from ..errors import CanvasError, UnknownTaskError
from ..names import check_name
from ..payload import check_json
from .names import ERRBACK_TASK, ROOT
from .node_rules import check_arguments

PLAN_VERSION = 1

TAKEOVERS = 2
"""Attempts a node has beyond its task's own retries, for workers that die under it."""

UNBOUNDED_RETRIES = 100
"""The retries of a task whose ``max_retries`` is None (Celery: no limit)."""

ROUTE_OPTIONS = ("queue", "exchange", "routing_key", "priority")
TASK_OPTIONS = {*ROUTE_OPTIONS, "countdown", "link", "link_error"}
COMPOSITE_OPTIONS = {"link", "link_error"}

Node = dict[str, Any]


def compile_plan(app: Celery, signature: Any) -> dict[str, Any]:
    """The JSON plan of ``signature``; :class:`CanvasError` for what cannot run."""
    if not isinstance(signature, Signature):
        raise CanvasError(
            f"durable() takes a Celery signature, chain, group or chord, got {signature!r}"
        )
    root = _Compiler(app).node(signature, ROOT)
    _check_calls(app, root, ROOT, fed=False)
    return {"pikku_canvas": PLAN_VERSION, "root": root}


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
            if kind == "chain":
                node = self.chain(sig, path)
            elif kind == "group":
                node = self.group(sig, path)
            elif kind == "chord":
                node = self.chord(sig, path)
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
        return self.composite_callbacks(sig, node, path)

    def group(self, sig: Signature, path: str) -> Node:
        self.composite_options(sig, path)
        members = _flattened(sig)
        node = {
            "t": "group",
            "items": [self.node(s, f"{path}.{i}") for i, s in enumerate(members)],
        }
        return self.composite_callbacks(sig, node, path)

    def chord(self, sig: Signature, path: str) -> Node:
        self.composite_options(sig, path)
        header = sig.tasks
        members = _flattened(header) if _is(header, "group") else _flat_list(header)
        if not members:
            raise CanvasError(
                f"{path}: a chord with an empty header has no results for its body "
                "(Celery would call the body with [] at once, or never)"
            )
        if sig.body is None:
            raise CanvasError(f"{path}: a chord needs a body")
        node = {
            "t": "chord",
            "header": [self.node(s, f"{path}.h{i}") for i, s in enumerate(members)],
            "body": self.node(sig.body, f"{path}.body"),
        }
        return self.composite_callbacks(sig, node, path)

    def composite_options(self, sig: Signature, path: str) -> None:
        unknown = sorted(set(sig.options) - COMPOSITE_OPTIONS)
        if unknown:
            raise CanvasError(
                f"{path}: option(s) {', '.join(unknown)} on a {sig.subtask_type} are not "
                "supported durably; set them on its tasks"
            )

    def composite_callbacks(self, sig: Signature, node: Node, path: str) -> Node:
        """A composite's own ``link``/``link_error`` options, placed as Celery places them."""
        for i, link in enumerate(_listed(sig.options.get("link"))):
            _attach_link(node, self.node(link, f"{path}.link{i}"), immutable=False)
        for errback in _listed(sig.options.get("link_error")):
            _attach_errback(node, errback, self, header=self.header_errbacks())
        return node

    def header_errbacks(self) -> bool:
        return bool(self.app.conf.task_allow_error_cb_on_chord_header)

    # --- tasks -------------------------------------------------------------------
    def task(self, sig: Signature, path: str) -> Node:
        name = self.task_name(sig.task, path)
        unknown = sorted(set(sig.options) - TASK_OPTIONS)
        if unknown:
            raise CanvasError(
                f"{path}: option(s) {', '.join(unknown)} of {name!r} are not supported "
                f"durably (supported: {', '.join(sorted(TASK_OPTIONS))})"
            )
        check_json(list(sig.args), f"canvas node {path} ({name})", "args")
        check_json(dict(sig.kwargs), f"canvas node {path} ({name})", "kwargs")
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
        countdown = sig.options.get("countdown")
        if countdown is not None:
            if not isinstance(countdown, (int, float)) or not math.isfinite(countdown):
                raise CanvasError(f"{path}: countdown must be a number of seconds")
            countdown = max(0.0, float(countdown))
        task = self.app.tasks[name]
        retries = task.max_retries if task.max_retries is not None else UNBOUNDED_RETRIES
        node: Node = {
            "t": "task",
            "task": name,
            "args": list(sig.args),
            "kwargs": dict(sig.kwargs),
            "immutable": bool(sig.immutable),
            "route": route,
            "countdown": countdown,
            "attempts": int(retries) + 1 + TAKEOVERS,
            "retry_delay": float(task.default_retry_delay or 0),
            "link": [],
            "errbacks": [],
        }
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
        check_json(list(errback.args), f"errback of canvas node {path}", "args")
        check_json(dict(errback.kwargs), f"errback of canvas node {path}", "kwargs")
        return {
            "task": name,
            "args": list(errback.args),
            "kwargs": dict(errback.kwargs),
            "immutable": bool(errback.immutable),
            "new_style": _new_style_errback(self.app, errback),
        }

    def task_name(self, name: Any, path: str) -> str:
        if not isinstance(name, str) or name not in self.app.tasks:
            raise UnknownTaskError(
                f"{path}: task {name!r} is not registered with Celery app {self.app.main!r}"
            )
        if name.startswith("celery.") or name.startswith("pikku.") or name == ERRBACK_TASK:
            raise CanvasError(f"{path}: {name!r} is a built-in task, not a canvas node")
        return name


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


def most_steps(node: Node) -> int:
    """The most steps a run of ``node`` can record: each task, its countdown
    timer, its links' steps and its errbacks (those only on failure)."""
    kind = node["t"]
    if kind in ("chain", "group"):
        return sum(most_steps(n) for n in node["items"]) + len(node.get("errbacks", []))
    if kind == "chord":
        return sum(most_steps(n) for n in node["header"]) + most_steps(node["body"])
    own = 1 + (1 if node["countdown"] else 0) + len(node["errbacks"])
    return own + sum(most_steps(n) for n in node["link"])
