"""Workflow versions: what a run records at start, and which body replays it.

A run records its workflow's version when it starts. An explicit version
(``@pikku.workflow(version="2")``) pins the run: it replays on that body
only, and a worker without it leaves the run for one that has it. Without
one, the version is a hash of the body's own source, recorded so people can
see which runs started on which code; it cannot pin, since a comment-free
edit of a helper the body calls changes the behaviour without changing the
hash and a reformatting would change a plain text hash with no change at
all. A run whose recorded version no registered body has (a hashed one after
an edit, or none: runs started before versions were recorded) replays on the
newest body whose replay of its history does not diverge; ``ctx.patched``
is what keeps an edited body replayable.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import marshal
import re
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import PayloadError, UnknownWorkflowVersionError
from ..model.values import Decision, RunState, RunStatus
from ..names import check_name

if TYPE_CHECKING:
    from .workflow import Workflow, WorkflowRegistry

HASH_PREFIX = "src:"
"""Leads a version made from the body's source (explicit versions may not)."""

MAX_VERSION_LENGTH = 64
"""Characters in a version (the ``workflow_version`` column's length)."""

_T = TypeVar("_T")
_PARTS = re.compile(r"\d+|\D+")


def explicit_version(value: Any) -> str:
    """``version=`` checked: a non-empty name of at most 64 characters (an int
    is taken as its digits), not starting with ``src:``."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = check_name(value, "workflow version", MAX_VERSION_LENGTH)
    if text.startswith(HASH_PREFIX):
        raise PayloadError(
            f"workflow version {text!r}: versions starting {HASH_PREFIX!r} are the hashes "
            "pikku records for workflows given no version"
        )
    return text


def source_version(fn: Callable[..., Any]) -> str:
    """``src:`` and 16 hex digits of a SHA-256 of the body's syntax tree.

    The tree of the function's own source, without its name, decorators
    and docstring, so comments, blank lines, formatting and the docstring leave
    it unchanged while any change to what the body does changes it. Where
    the source cannot be read (a function made by ``exec``), the compiled
    code is hashed instead, which also changes with line numbers.
    """
    digest = hashlib.sha256(_body_fingerprint(fn), usedforsecurity=False).hexdigest()
    return HASH_PREFIX + digest[:16]


def _body_fingerprint(fn: Callable[..., Any]) -> bytes:
    target = inspect.unwrap(fn)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(target)))
    except (OSError, TypeError, SyntaxError):
        code = getattr(target, "__code__", None)
        return marshal.dumps(code) if code is not None else repr(target).encode()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.name = ""  # the workflow's name is its name=, not the function's
            node.decorator_list = []
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
            return ast.dump(node, include_attributes=False).encode()
    return ast.dump(tree, include_attributes=False).encode()


def version_order(version: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Sort key of versions: numbers compared as numbers (``"10"`` after
    ``"9"``, ``"1.10"`` after ``"1.9"``), the rest as text."""
    parts = tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _PARTS.findall(version)
    )
    return parts, version


def is_pinned(version: str | None) -> bool:
    """Whether a recorded version pins its run (an explicit one)."""
    return version is not None and not version.startswith(HASH_PREFIX)


def candidates(registry: WorkflowRegistry, run: RunState) -> list[Workflow[Any, Any]]:
    """The bodies that may replay ``run``, to try in order.

    Its own version when registered; a pinned version that is not raises
    :class:`UnknownWorkflowVersionError` (this worker lacks it: the run is
    left for one that has it); otherwise every version, newest first.
    """
    versions = registry.versions(run.workflow)  # UnknownWorkflowError if none
    recorded = run.workflow_version
    for wf in versions:
        if wf.version == recorded:
            return [wf]
    if is_pinned(recorded):
        known = ", ".join(repr(wf.version) for wf in versions)
        raise UnknownWorkflowVersionError(
            f"run {run.id} started on version {recorded!r} of workflow {run.workflow!r}, "
            f"which this worker does not have (it has {known}); left for a worker that does"
        )
    return list(versions)


def first_replaying(
    bodies: Sequence[Workflow[Any, Any]],
    attempt: Callable[[Workflow[Any, Any]], _T],
    diverged: Callable[[_T], bool],
) -> tuple[Workflow[Any, Any], _T]:
    """The first body whose ``attempt`` does not diverge, with its result; if
    all do, the first body's (its error names the steps of the newest code)."""
    first: tuple[Workflow[Any, Any], _T] | None = None
    for wf in bodies:
        result = attempt(wf)
        if not diverged(result):
            return wf, result
        if first is None:
            first = (wf, result)
    assert first is not None, "no body to replay on"
    return first


def diverged(decision: Decision) -> bool:
    """Whether a pass's decision is a failure by divergence from the history."""
    return (
        decision.run_status == RunStatus.FAILED
        and decision.error is not None
        and decision.error.get("type") == "WorkflowNondeterminismError"
    )
