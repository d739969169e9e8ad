"""What a canvas plan has produced so far, as Celery would pass results along.

One pure walk over the plan, given what each node's step did: a chain
prepends each result to the next step's arguments (unless immutable), a group
gives its results in order, a chord's body gets the header's list; a success
runs the node's links with its result, a failure its errbacks. The walk asks a
:class:`Driver` for each step's state, and the driver starts a step the first
time the walk finds it ready, so the same walk drives a run (the canvas
workflow) and reads a settled one (its handle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from .plan import Node


@dataclass(frozen=True)
class Done:
    """A node that succeeded, with what ``AsyncResult.get()`` would return for it."""

    value: Any


@dataclass(frozen=True)
class Failed:
    """A node that failed for good (its step's attempts, or its task's retries, spent)."""

    step: str
    """The step name of the node whose failure this is."""
    error: dict[str, Any]
    """``type``, ``message``, ``traceback``: as the step recorded it, or a
    chord's ``ChordError`` naming the header member that failed."""


class Pending:
    """Not settled yet: a step in flight, a countdown running, or just started."""


PENDING = Pending()
Outcome = Done | Failed | Pending


class Driver(Protocol):
    """Where the walk learns each step's state (and starts the ones now ready)."""

    def task(self, path: str, node: Node, args: list[Any], kwargs: dict[str, Any]) -> Outcome:
        """The state of a task node's step, started with these arguments if new."""

    def errback(self, path: str, errback: Node, failed: Failed, request: dict[str, Any]) -> bool:
        """Whether the errback step for ``failed`` settled (started if new)."""

    def step_id(self, path: str) -> str:
        """The stable id of a node's step (what errbacks get as the task id)."""


class Evaluator:
    """Walks a plan; ``busy`` says whether anything anywhere is still unsettled."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.busy = False

    def run(self, node: Node, path: str, prepend: list[Any] | None) -> Outcome:
        """The outcome of ``node`` at ``path``, ``prepend`` being what the
        step before it passes on (None at the root: nothing)."""
        kind = node["t"]
        if kind == "task":
            return self._task(node, path, prepend)
        if kind == "chain":
            return self._chain(node, path, prepend)
        if kind == "group":
            outcomes = [self.run(n, f"{path}.{i}", prepend) for i, n in enumerate(node["items"])]
            return _joined(outcomes)
        return self._chord(node, path, prepend)

    def _task(self, node: Node, path: str, prepend: list[Any] | None) -> Outcome:
        args = list(node["args"])
        if prepend is not None and not node["immutable"]:
            args = [*prepend, *args]
        kwargs = dict(node["kwargs"])
        outcome = self.driver.task(path, node, args, kwargs)
        if isinstance(outcome, Pending):
            self.busy = True
        elif isinstance(outcome, Done):
            for i, link in enumerate(node["link"]):
                self.run(link, f"{path}.link{i}", [outcome.value])  # its result is its own
        else:
            request = {
                "id": self.driver.step_id(path),
                "task": node["task"],
                "args": args,
                "kwargs": kwargs,
            }
            self._errbacks(node, path, outcome, request)
        return outcome

    def _errbacks(self, node: Node, path: str, failed: Failed, request: dict[str, Any]) -> None:
        for i, errback in enumerate(node.get("errbacks", [])):
            if not self.driver.errback(f"{path}.err{i}", errback, failed, request):
                self.busy = True

    def _chain(self, node: Node, path: str, prepend: list[Any] | None) -> Outcome:
        outcome: Outcome = PENDING
        for i, item in enumerate(node["items"]):
            outcome = self.run(item, f"{path}.{i}", prepend)
            if not isinstance(outcome, Done):
                return outcome  # a failure stops the chain; pending waits
            prepend = [outcome.value]
        return outcome

    def _chord(self, node: Node, path: str, prepend: list[Any] | None) -> Outcome:
        header = [self.run(n, f"{path}.h{i}", prepend) for i, n in enumerate(node["header"])]
        joined = _joined(header)
        if isinstance(joined, Pending):
            return joined
        if isinstance(joined, Failed):
            # The chord's result raises the header member's own error (as
            # ``AsyncResult.get()`` does, following the body's parents); the
            # body's errbacks get Celery's ChordError naming that member.
            chord_error = _chord_error(self.driver.step_id(joined.step), joined)
            body = node["body"]
            if body["t"] == "group":
                self._group_body_errbacks(body, f"{path}.body", joined)
            elif body["t"] in ("task", "chain"):
                # Celery calls the body's errbacks (a chain's own) with the
                # ChordError, under a request describing the body that never ran.
                task = body["task"] if body["t"] == "task" else "celery.chain"
                request = {
                    "id": self.driver.step_id(f"{path}.body"),
                    "task": task,
                    "args": list(body.get("args", [])),
                    "kwargs": dict(body.get("kwargs", {})),
                }
                self._errbacks(body, f"{path}.body", chord_error, request)
            return joined
        assert isinstance(joined, Done)
        return self.run(node["body"], f"{path}.body", [joined.value])

    def _group_body_errbacks(self, body: Node, path: str, failed: Failed) -> None:
        """A group body that will never run: Celery calls each member task's
        errbacks with the header's own error (no traceback), under a request
        that knows only the member's id."""
        error = Failed(failed.step, {**failed.error, "traceback": ""})
        for i, member in enumerate(body["items"]):
            if member["t"] == "task":
                member_path = f"{path}.{i}"
                request = {
                    "id": self.driver.step_id(member_path),
                    "task": "unknown",
                    "args": [],
                    "kwargs": {},
                }
                self._errbacks(member, member_path, error, request)


def _joined(outcomes: list[Outcome]) -> Outcome:
    """A group's outcome: pending while any member is, else the first failure
    in order (as ``GroupResult.get()`` raises it), else the list."""
    if any(isinstance(o, Pending) for o in outcomes):
        return PENDING
    for o in outcomes:
        if isinstance(o, Failed):
            return o
    return Done([o.value for o in outcomes if isinstance(o, Done)])


def _chord_error(culprit_id: str, failed: Failed) -> Failed:
    """The error Celery gives a chord's body whose header failed (no traceback:
    the body never ran)."""
    error = failed.error
    reason = f"{error.get('type', 'Exception')}({error.get('message', '')!r})"
    message = f"Dependency {culprit_id} raised {reason}"
    return Failed(failed.step, {"type": "ChordError", "message": message, "traceback": ""})
