"""What the engine tells its observers (metrics, traces), as it happens.

An observer sees what only the worker process knows: how long a body ran,
which writes were refused, what a sweep woke. Observers never break the
engine: one that raises is logged and the engine goes on.

Besides these notices the engine opens scopes an observer may wrap (a
tracer makes them spans): a run's start, each step attempt from its claim
to its outcome, each orchestration pass a message asked for, each sweep.
The engine itself knows no tracing library: a scope's trace context is an
opaque carrier (``dict[str, str]``) that the engine stores with a run and
messages carry, see :data:`run_trace`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, TypeVar

from ..model.values import RunState, StepOutcome, StepState

if TYPE_CHECKING:
    from .sweep import SweepReport

log = logging.getLogger(__name__)

Carrier = dict[str, str]
"""A trace context as text (a W3C carrier): stored with a run, carried on messages."""

run_trace: ContextVar[Carrier | None] = ContextVar("pikku_run_trace", default=None)
"""The trace context of the run whose work this thread is doing now, if a
tracing observer set one: pikku's messages sent meanwhile carry it, so the
pass or attempt they start joins that run's trace."""


class RunStart:
    """A run being started: the trace context to store with it, and what came of it."""

    trace_context: Carrier | None = None

    def created(self, run: RunState, created: bool) -> None:
        """The run is stored (``created`` False: an idempotency key found it)."""


class AttemptWatch:
    """One attempt being watched, from its claim to its outcome."""

    def recorded(self, outcome: StepOutcome) -> None:
        """Its outcome was written."""

    def refused(self) -> None:
        """Its outcome was refused: the attempt was superseded or its claim lost."""


_NO_START = RunStart()
_NO_WATCH = AttemptWatch()
_T = TypeVar("_T")
_R = TypeVar("_R")


class EngineObserver:
    """Override what you need; every method does nothing by default."""

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        """An attempt's body ran and its outcome was recorded. ``step`` is the
        step as claimed (its queue, task, attempt; ``scheduled_at`` and
        ``updated_at`` give its wait for a worker on the store's clock)."""

    def write_refused(self, step_id: str, attempt: int, claim_lost: bool) -> None:
        """An outcome of a superseded attempt (or of a lost claim) was refused."""

    def run_settled(self, run: RunState) -> None:
        """A pass of this process ended the run."""

    def swept(self, report: SweepReport) -> None:
        """A sweep ran; ``report`` says what it woke, by reason."""

    def starting(self, workflow: str) -> AbstractContextManager[RunStart]:
        """Around ``start()``: storing the run and its first pass."""
        return nullcontext(_NO_START)

    def attempt(
        self, step: StepState, dispatch: str, claimed_ns: int, trace: Carrier | None
    ) -> AbstractContextManager[AttemptWatch]:
        """Around one claimed attempt of ``step``: its body and the pass that
        records its outcome. ``dispatch`` says how it reached this worker
        (``"broker"``, ``"eager"``), ``claimed_ns`` when its claim began
        (``time.time_ns()``), ``trace`` the trace context its message carried."""
        return nullcontext(_NO_WATCH)

    def passing(
        self, run: RunState, reason: str, trace: Carrier | None
    ) -> AbstractContextManager[None]:
        """Around an orchestration pass of ``run`` that a message asked for."""
        return nullcontext()

    def sweeping(self) -> AbstractContextManager[None]:
        """Around one sweep (:meth:`swept` is told inside it)."""
        return nullcontext()


class _Starts(RunStart):
    def __init__(self, starts: list[RunStart]) -> None:
        self._starts = starts
        self.trace_context = next(
            (s.trace_context for s in starts if s.trace_context is not None), None
        )

    def created(self, run: RunState, created: bool) -> None:
        for start in self._starts:
            Observers._tell(start.created, run, created)


class _Watches(AttemptWatch):
    def __init__(self, watches: list[AttemptWatch]) -> None:
        self._watches = watches

    def recorded(self, outcome: StepOutcome) -> None:
        for watch in self._watches:
            Observers._tell(watch.recorded, outcome)

    def refused(self) -> None:
        for watch in self._watches:
            Observers._tell(watch.refused)


class Observers(EngineObserver):
    """Every observer of one engine, each told in turn."""

    def __init__(self) -> None:
        self._observers: list[EngineObserver] = []

    def add(self, observer: EngineObserver) -> None:
        """Tell ``observer`` from now on."""
        self._observers.append(observer)

    def __bool__(self) -> bool:
        return bool(self._observers)

    def step_attempted(self, step: StepState, outcome: StepOutcome, run_seconds: float) -> None:
        for observer in self._observers:
            self._tell(observer.step_attempted, step, outcome, run_seconds)

    def write_refused(self, step_id: str, attempt: int, claim_lost: bool) -> None:
        for observer in self._observers:
            self._tell(observer.write_refused, step_id, attempt, claim_lost)

    def run_settled(self, run: RunState) -> None:
        for observer in self._observers:
            self._tell(observer.run_settled, run)

    def swept(self, report: SweepReport) -> None:
        for observer in self._observers:
            self._tell(observer.swept, report)

    def starting(self, workflow: str) -> AbstractContextManager[RunStart]:
        if not self._observers:
            return nullcontext(_NO_START)
        return self._wrapped(lambda o: o.starting(workflow), _Starts)

    def attempt(
        self, step: StepState, dispatch: str, claimed_ns: int, trace: Carrier | None
    ) -> AbstractContextManager[AttemptWatch]:
        if not self._observers:
            return nullcontext(_NO_WATCH)
        return self._wrapped(lambda o: o.attempt(step, dispatch, claimed_ns, trace), _Watches)

    def passing(
        self, run: RunState, reason: str, trace: Carrier | None
    ) -> AbstractContextManager[None]:
        if not self._observers:
            return nullcontext()
        return self._wrapped(lambda o: o.passing(run, reason, trace), lambda _: None)

    def sweeping(self) -> AbstractContextManager[None]:
        if not self._observers:
            return nullcontext()
        return self._wrapped(lambda o: o.sweeping(), lambda _: None)

    @contextmanager
    def _wrapped(
        self,
        open_scope: Callable[[EngineObserver], AbstractContextManager[_T]],
        combine: Callable[[list[_T]], _R],
    ) -> Iterator[_R]:
        """Every observer's scope around the engine's work; one that fails to
        open or close is logged and left out, and none can swallow an error."""
        entered: list[tuple[AbstractContextManager[_T], _T]] = []
        for observer in self._observers:
            try:
                scope = open_scope(observer)
                entered.append((scope, scope.__enter__()))
            except Exception:
                log.exception("an engine observer failed (ignored)")
        failure: tuple[object, object, object] = (None, None, None)
        try:
            yield combine([value for _, value in entered])
        except BaseException:
            failure = sys.exc_info()
            raise
        finally:
            for scope, _ in reversed(entered):
                try:
                    scope.__exit__(*failure)  # type: ignore[arg-type]
                except Exception:
                    log.exception("an engine observer failed (ignored)")

    @staticmethod
    def _tell(method: object, *args: object) -> None:
        try:
            method(*args)  # type: ignore[operator]
        except Exception:
            log.exception("an engine observer failed (ignored)")
