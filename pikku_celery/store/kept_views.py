"""What this process last saw of a run, kept so the next optimistic pass skips its read.

Three kinds, each kept only while it is surely current: the run as a claim
read it (for that attempt's pass, while the claim's first lease is live), a
run this thread just created (for its first pass), and the run as this
store's last optimistic pass left it (for the claim of the step that pass
scheduled). Every pass's write is version-checked, so a stale view costs a
retry, never a wrong write.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .base import Decide
from .model import JSON, Decision, RunState, RunView, StepState


class FirstPass:
    """A new run's first pass, decided on the run as created. If the locked
    pass takes over (the decision is more than the optimistic statement
    writes) and finds the run untouched, it applies that same view and
    decision instead of deciding again."""

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self.made: tuple[RunView, Decision] | None = None

    def decide(self, view: RunView) -> Decision:
        """Decide, and remember the view and decision made."""
        decision = self._decide(view)
        self.made = (view, decision)
        return decision

    def reused(
        self, run: RunState, steps: list[StepState], signals: dict[str, JSON]
    ) -> tuple[RunView, Decision] | None:
        """The view and decision made, if the locked pass found the run as it was."""
        made = self.made
        if made is not None and run == made[0].run and not steps and not signals:
            return made
        return None


class DatabaseClock:
    """The database's clock as this process last read it, moved on by the
    monotonic clock: for a write whose "now" needs no round trip of its own
    (a new run's creation time). Trusted for FRESH_RUN_MS after a reading."""

    def __init__(self) -> None:
        self._read: tuple[int, float] | None = None

    def saw(self, db_now: int) -> None:
        """The database said it was ``db_now`` (epoch ms) just now."""
        self._read = (db_now, time.monotonic())

    def now(self) -> int | None:
        """The database's clock now, or None without a recent reading."""
        read = self._read
        if read is None:
            return None
        elapsed = time.monotonic() - read[1]
        return None if elapsed * 1000 > FRESH_RUN_MS else read[0] + int(elapsed * 1000)


CLAIM_VIEWS_KEPT = 1024
CLAIM_VIEW_MARGIN_MS = 250
FRESH_RUN_MS = 10_000  # a new run's first pass skips its read within this long


def remember(views: OrderedDict[Any, Any], key: Any, view: Any) -> None:
    """Keep ``view`` for its pass; the oldest goes once CLAIM_VIEWS_KEPT are
    kept (bodies that never came back, runs created but never advanced)."""
    if len(views) >= CLAIM_VIEWS_KEPT:
        # popitem, not pop(next(iter(...))): a threads pool shares the store,
        # and another thread's change would break the iteration.
        with contextlib.suppress(KeyError):
            views.popitem(last=False)
    views[key] = view


@dataclass(frozen=True)
class ClaimView:
    """The run as a claim read it (or as the pass that scheduled the step
    left it), for that attempt's pass."""

    run: RunState
    steps: list[StepState]
    db_now: int
    has_signals: bool
    read_at: float  # time.monotonic() of the claim
    lease_expires_at: int  # of the claimed attempt, as granted
    input_size: int  # of the run's input as stored (its JSON text's length)

    def now(self) -> int:
        """The database's clock now, moved on by this process's monotonic clock."""
        return self.db_now + int((time.monotonic() - self.read_at) * 1000)

    def still_ours(self, run_id: str) -> bool:
        """Usable while the claim's first lease is surely live: until then no
        other attempt can have taken the step, so the view's fence holds."""
        return self.run.id == run_id and self.now() + CLAIM_VIEW_MARGIN_MS < self.lease_expires_at


@dataclass(frozen=True)
class Passed:
    """A run's steps as an optimistic pass of this store wrote them."""

    run: RunState  # the run as that pass left it (its version, its input)
    steps: list[StepState]
    input_size: int  # of the run's input as stored (its JSON text's length)
    has_signals: bool  # as that pass saw (a signal since moves the version)

    def steps_claimed(self, step: StepState) -> list[StepState]:
        """The run's steps with ``step`` as its claim left it."""
        return [step if s.id == step.id else s for s in self.steps]


PASSED_KEPT = 256
PASSED_INPUT_BYTES = 32 * 1024 * 1024


class PassedRuns:
    """The runs this store's optimistic passes left, by the step each scheduled.

    An entry is taken by that step's claim, when it lands in this process; in
    a prefork pool about half land in another, and theirs stay until pushed
    out. So the oldest go once PASSED_KEPT are kept, or once the inputs they
    hold (up to max_input_bytes each) pass PASSED_INPUT_BYTES.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[str, Passed] = OrderedDict()
        self._input_bytes = 0
        self._lock = threading.Lock()  # a threads pool shares the store

    def put(self, step_id: str, passed: Passed) -> None:
        """Keep the run as a pass left it, for the claim of ``step_id``."""
        with self._lock:
            old = self._kept.pop(step_id, None)
            if old is not None:
                self._input_bytes -= old.input_size
            self._kept[step_id] = passed
            self._input_bytes += passed.input_size
            while len(self._kept) > PASSED_KEPT or (
                self._input_bytes > PASSED_INPUT_BYTES and len(self._kept) > 1
            ):
                _, dropped = self._kept.popitem(last=False)
                self._input_bytes -= dropped.input_size

    def take(self, step_id: str) -> Passed | None:
        """The run kept for the claim of ``step_id`` (once), or None."""
        with self._lock:
            passed = self._kept.pop(step_id, None)
            if passed is not None:
                self._input_bytes -= passed.input_size
            return passed

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def input_bytes(self) -> int:
        """The bytes of the inputs kept, as counted."""
        return self._input_bytes

    def counted_bytes(self) -> int:
        """The bytes of the inputs kept, summed afresh (to check the count)."""
        with self._lock:
            return sum(p.input_size for p in self._kept.values())
