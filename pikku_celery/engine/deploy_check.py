"""The deploy check: replay every run in flight on the code at hand, writing nothing.

Each run is replayed on the body a worker running this code would choose
(:mod:`.choose`) over the history a pass would read, and the pass's own
decision is thrown away. A run is reported when that replay diverges from
its history (the step where), when no body here may replay it (it would
stay blocked), or when the body raises. Runs are read a page at a time
(:meth:`~pikku_celery.ports.store.WorkflowStore.in_flight_views`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import UnknownWorkflowError, WorkflowNondeterminismError
from ..model.values import RunView
from .context import Context, Suspend
from .limits import PassBudgetSpent
from .orchestrate import check_readable
from .versions import candidates, first_replaying
from .workflow import Workflow

if TYPE_CHECKING:
    from .core import WorkflowEngine

Problem = Literal["diverges", "blocked", "fails"]

PAGE = 500


@dataclass(frozen=True)
class RunCheck:
    """A run in flight that the code at hand would not carry on.

    ``problem``: ``diverges`` (its replay reaches ``reached`` where its history
    holds ``recorded``, at step ``index``), ``blocked`` (no body here may
    replay it: an unknown workflow, a pinned version not registered) or
    ``fails`` (the body raises on replay). Steps are ``(kind, name)``.
    """

    run_id: str
    workflow: str
    version: str | None  # the version the run started on
    replays_on: str | None  # the version of the body the check replayed it on
    problem: Problem
    message: str
    error_type: str
    index: int | None = None
    recorded: tuple[str, str] | None = None
    reached: tuple[str, str] | None = None


@dataclass
class DeployCheck:
    """What the check found: how many runs it replayed and those that would fail."""

    checked: int = 0
    failing: list[RunCheck] = field(default_factory=list)
    versions: Counter[tuple[str, str | None]] = field(default_factory=Counter)
    """Runs in flight per ``(workflow, version started on)``."""
    unknown: Counter[str] = field(default_factory=Counter)
    """Runs in flight per workflow name the code at hand does not register
    at all (not replayed: the check cannot judge them, see ``looked``)."""
    looked: str | None = None
    """Where the engine looked for workflows (its registry's loader)."""

    @property
    def ok(self) -> bool:
        """Whether every run in flight replays on this code."""
        return not self.failing and not self.unknown


@dataclass(frozen=True)
class _Trial:
    error: BaseException | None = None

    @property
    def diverged(self) -> bool:
        return isinstance(self.error, WorkflowNondeterminismError)


def check_deploy(
    engine: WorkflowEngine, page: int = PAGE, workflows: Collection[str] | None = None
) -> DeployCheck:
    """Replay every run in flight in ``engine``'s store on ``engine``'s code
    (only runs of ``workflows``, when given)."""
    report = DeployCheck(looked=engine.registry.load())
    after: str | None = None
    while True:
        views = engine.store.in_flight_views(after, page)
        for view in views:
            if workflows is not None and view.run.workflow not in workflows:
                continue
            if not engine.registry.known(view.run.workflow):
                report.unknown[view.run.workflow] += 1
                continue
            report.checked += 1
            report.versions[(view.run.workflow, view.run.workflow_version)] += 1
            found = check_run(engine, view)
            if found is not None:
                report.failing.append(found)
        if len(views) < page:
            return report
        after = views[-1].run.id


def check_run(engine: WorkflowEngine, view: RunView) -> RunCheck | None:
    """The problem the code at hand has with this run, or None if it replays."""
    run = view.run
    if run.cancel_requested:
        return None  # its next pass cancels it, whatever the code
    try:
        bodies = candidates(engine.registry, run)
    except UnknownWorkflowError as exc:
        return _found(view, None, "blocked", exc)
    try:
        check_readable(view)
    except Exception as exc:
        return _found(view, None, "fails", exc)
    body, trial = first_replaying(bodies, lambda wf: _replay(engine, wf, view), _diverged)
    if trial.error is None:
        return None
    return _found(view, body, "diverges" if trial.diverged else "fails", trial.error)


def _diverged(trial: _Trial) -> bool:
    return trial.diverged


def _replay(engine: WorkflowEngine, workflow: Workflow[Any, Any], view: RunView) -> _Trial:
    """One pass's replay, keeping its error and nothing else."""
    ctx = Context(
        view,
        engine.dispatcher.task_name,
        engine.dispatcher.task_queue,
        engine.registry.get,
        engine.limits,
    )
    try:
        workflow.run_body(ctx, view.run.input)
    except Suspend:
        pass
    except (Exception, PassBudgetSpent) as exc:
        return _Trial(exc)
    return _Trial()


def _found(
    view: RunView, body: Workflow[Any, Any] | None, problem: Problem, exc: BaseException
) -> RunCheck:
    if isinstance(exc, UnknownWorkflowError):
        problem = "blocked"  # an unknown patch marker: left for code that knows it
    where = exc if isinstance(exc, WorkflowNondeterminismError) else None
    return RunCheck(
        run_id=view.run.id,
        workflow=view.run.workflow,
        version=view.run.workflow_version,
        replays_on=None if body is None else body.version,
        problem=problem,
        message=str(exc),
        error_type=type(exc).__name__,
        index=None if where is None else where.index,
        recorded=None if where is None else where.recorded,
        reached=None if where is None else where.reached,
    )
