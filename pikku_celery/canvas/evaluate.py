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

from .added import NOT_IN_CHORD
from .lineage import CALLER, Lineage, after, header_end, node_extras, result_ids, task_lineage
from .plan import Node

SLICE_ABOVE = 24
"""Groups (and chord headers) with more members than this run in slices
(:mod:`.slices`)."""

UNRUN = ".unrun"
"""The suffix of the step that marks never-run nodes' result ids failed."""


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
    in_chord_header: bool = False
    """A chord's header failed here, so its body never ran: Celery then never
    counts that chord in as a member of a chord around it, whose body's
    errbacks are not called for it."""


class Pending:
    """Not settled yet: a step in flight, a countdown running, or just started."""


PENDING = Pending()
Outcome = Done | Failed | Pending


class Driver(Protocol):
    """Where the walk learns each step's state (and starts the ones now ready)."""

    def task(
        self,
        path: str,
        node: Node,
        args: list[Any],
        kwargs: dict[str, Any],
        extras: dict[str, Any],
    ) -> Outcome:
        """The state of a task node's step, started with these arguments (and
        these request fields of its own) if new."""

    def errback(self, path: str, errback: Node, failed: Failed, request: dict[str, Any]) -> bool:
        """Whether the errback step for ``failed`` settled (started if new)."""

    def step_id(self, path: str) -> str:
        """The stable id of a node's step (what errbacks get as the task id)."""

    def added_to_chord(self, path: str) -> list[Outcome]:
        """The outcomes of what the task at ``path`` added to its chord."""

    def additions_outside_a_chord(self, path: str) -> bool:
        """Whether the task at ``path`` called ``add_to_chord``."""

    def slices(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        """The outcome of a large group run as child runs of its slices
        (started if new, under ``lineage``); see :mod:`.slices`."""

    def fail_unrun(self, path: str, ids: list[str], failed: Failed) -> bool:
        """Whether the step that marks the result ids of nodes that will never
        run (after a chord's header failed) as failed settled (started if new)."""


class Evaluator:
    """Walks a plan; ``busy`` says whether anything anywhere is still unsettled."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.busy = False
        self.members: set[str] = set()  # the paths of chord header members' tasks

    def run(
        self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage = CALLER
    ) -> Outcome:
        """The outcome of ``node`` at ``path``, ``prepend`` being what the
        step before it passes on (None at the root: nothing), ``lineage``
        the task that starts it (:mod:`.lineage`)."""
        kind = node["t"]
        if kind == "task":
            return self._task(node, path, prepend, lineage)
        if kind == "chain":
            return self._chain(node, path, prepend, lineage)
        if kind == "group":
            return self._group(node, path, prepend, lineage)
        return self._chord(node, path, prepend, lineage)

    def _group(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        items = node["items"]
        if len(items) > SLICE_ABOVE and not node.get("whole"):
            outcome = self.driver.slices(node, path, prepend, lineage)
            if isinstance(outcome, Pending):
                self.busy = True
            return outcome
        first, member = int(node.get("first", 0)), node.get("member", "")
        if member == "h":  # a slice of a chord's header
            for i, n in enumerate(items):
                self.members.update(_member_tasks(n, f"{path}.h{first + i}"))
        outcomes = [
            self.run(n, f"{path}.{member}{first + i}", prepend, lineage)
            for i, n in enumerate(items)
        ]
        return _joined(outcomes)

    def task_id(self, node: Node, path: str) -> str:
        """The id a task node's result has: the caller's (frozen, ``task_id=``)
        or its step's stable id."""
        chosen = node.get("id")
        return chosen if isinstance(chosen, str) else self.driver.step_id(path)

    def _task(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        args = list(node["args"])
        if prepend is not None and not node["immutable"]:
            args = [*prepend, *args]
        kwargs = dict(node["kwargs"])
        own = self.task_id(node, path)
        outcome = self.driver.task(path, node, args, kwargs, node_extras(own, node, lineage))
        if (
            isinstance(outcome, Done)
            and path not in self.members
            and self.driver.additions_outside_a_chord(path)
        ):
            # Celery raises this in the task: it belongs to no chord.
            outcome = Failed(path, {"type": "ValueError", "message": NOT_IN_CHORD})
        if isinstance(outcome, Pending):
            self.busy = True
        elif isinstance(outcome, Done):
            sent_by = (task_lineage(own, lineage)[0], own)  # its links are sent by it
            for i, link in enumerate(node["link"]):
                self.run(link, f"{path}.link{i}", [outcome.value], sent_by)
        else:
            request = {
                "id": self.task_id(node, path),
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

    def _chain(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        outcome: Outcome = PENDING
        items = node["items"]
        for i, item in enumerate(items):
            outcome = self.run(item, f"{path}.{i}", prepend, lineage)
            if isinstance(outcome, Failed) and item["t"] == "chord" and outcome.in_chord_header:
                # Celery marks the chain's later results failed too, so
                # whatever waits on them (a group around it) ends.
                rest = [
                    r
                    for k in range(i + 1, len(items))
                    for r in result_ids(items[k], f"{path}.{k}", self.task_id)
                ]
                chord_error = _chord_error(self.driver.step_id(outcome.step), outcome)
                self._fail_unrun(f"{path}.{i}.rest", rest, chord_error)
            if not isinstance(outcome, Done):
                return outcome  # a failure stops the chain; pending waits
            prepend = [outcome.value]
            lineage = after(item, f"{path}.{i}", lineage, self.task_id)
        return outcome

    def _fail_unrun(self, path: str, ids: list[str], failed: Failed) -> None:
        if ids and not self.driver.fail_unrun(path + UNRUN, ids, failed):
            self.busy = True

    def _chord(self, node: Node, path: str, prepend: list[Any] | None, lineage: Lineage) -> Outcome:
        for i, member in enumerate(node["header"]):
            self.members.update(_member_tasks(member, f"{path}.h{i}"))
        sliced = len(node["header"]) > SLICE_ABOVE
        if sliced:
            members = {"t": "group", "items": node["header"], "member": "h"}
            header = [self._group(members, path, prepend, lineage)]  # the members' list, whole
        else:
            header = [
                self.run(n, f"{path}.h{i}", prepend, lineage) for i, n in enumerate(node["header"])
            ]
        for i, member in enumerate(node["header"]):
            # What a member added (``self.add_to_chord``) joins the header, after it.
            for task_path in _member_tasks(member, f"{path}.h{i}"):
                header += self.driver.added_to_chord(task_path)
        joined = _joined(header)
        if sliced and isinstance(joined, Done):
            joined = Done([*joined.value[0], *joined.value[1:]])
        if isinstance(joined, Pending):
            return joined
        if isinstance(joined, Failed):
            # The chord's result raises the header member's own error (as
            # ``AsyncResult.get()`` does, following the body's parents); the
            # body's errbacks get Celery's ChordError naming that member.
            chord_error = _chord_error(self.driver.step_id(joined.step), joined)
            body, body_path = node["body"], f"{path}.body"
            while body["t"] == "chord":
                # A chord body that never runs: its own body's errbacks stand for it.
                body, body_path = body["body"], f"{body_path}.body"
            if not joined.in_chord_header:
                # Celery marks the body's results failed with the ChordError.
                # (a group body's members: with the header member's own error)
                failed_ids = result_ids(node["body"], f"{path}.body", self.task_id)
                own = Failed(joined.step, {**joined.error, "traceback": ""})
                marked = own if node["body"]["t"] == "group" else chord_error
                self._fail_unrun(f"{path}.body", failed_ids, marked)
            if joined.in_chord_header:
                pass  # a nested chord's header failed: Celery never reaches this body
            elif body["t"] == "group":
                self._group_body_errbacks(body, body_path, joined)
            elif body["t"] in ("task", "chain"):
                # Celery calls the body's errbacks (a chain's own) with the
                # ChordError, under a request describing the body that never ran.
                task = body["task"] if body["t"] == "task" else "celery.chain"
                request = {
                    "id": self.task_id(body, body_path),
                    "task": task,
                    "args": list(body.get("args", [])),
                    "kwargs": dict(body.get("kwargs", {})),
                }
                self._errbacks(body, body_path, chord_error, request)
            return Failed(joined.step, joined.error, in_chord_header=True)
        assert isinstance(joined, Done)
        body_lineage = header_end(node, path, lineage, self.task_id)
        return self.run(node["body"], f"{path}.body", [joined.value], body_lineage)

    def _group_body_errbacks(self, body: Node, path: str, failed: Failed) -> None:
        """A group body that will never run: Celery calls each member task's
        errbacks with the header's own error (no traceback), under a request
        that knows only the member's id."""
        error = Failed(failed.step, {**failed.error, "traceback": ""})
        for i, member in enumerate(body["items"]):
            self._never_run_errbacks(member, f"{path}.{i}", error)

    def _never_run_errbacks(self, node: Node, path: str, error: Failed) -> None:
        """The errbacks of a group body's member that will never run: a
        task's own, a chain's, a chord's body's (the result it stands for)."""
        kind = node["t"]
        if kind == "task":
            request = {"id": self.task_id(node, path), "task": "unknown", "args": [], "kwargs": {}}
            self._errbacks(node, path, error, request)
        elif kind == "chain":
            request = {"id": self.driver.step_id(path), "task": "unknown", "args": [], "kwargs": {}}
            self._errbacks(node, path, error, request)
        elif kind == "chord":
            self._never_run_errbacks(node["body"], f"{path}.body", error)
        else:
            for i, member in enumerate(node["items"]):
                self._never_run_errbacks(member, f"{path}.{i}", error)


def _member_tasks(node: Node, path: str) -> list[str]:
    """The paths of the tasks that are a chord's members through ``node``: a
    task, a chain's last task, a group's members' (a nested chord's are its own)."""
    kind = node["t"]
    if kind == "task":
        return [path]
    if kind == "chain":
        last = len(node["items"]) - 1
        return _member_tasks(node["items"][last], f"{path}.{last}")
    if kind == "group":
        return [p for i, n in enumerate(node["items"]) for p in _member_tasks(n, f"{path}.{i}")]
    return []


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
