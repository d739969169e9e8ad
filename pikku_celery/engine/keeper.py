"""One background thread per process renews the leases of running steps.

A step shorter than half its lease never renews: its first renewal is due at
lease/2 and it is dropped before then. A refused renewal (the step moved on to
another attempt) sets ``lost`` at once; a renewal that errors (store briefly
down) is a loss only once the lease's own deadline has passed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field

from ..ports.store import WorkflowStore

log = logging.getLogger(__name__)


@dataclass(eq=False)
class StepHolding:
    """One running step whose lease the keeper renews; ``lost`` is set once it lost it."""

    step_id: str
    attempt: int
    lease_ms: int
    claim_id: str | None = None  # renewals are fenced on the claim too
    lost: threading.Event = field(default_factory=threading.Event)
    renewals: int = 0
    deadline: float = 0.0  # monotonic: when the last granted lease ends
    dropped: bool = False
    renew_until: float = float("inf")  # monotonic: its time limit; a hung body is not kept alive
    run_id: str | None = None  # its run: each renewal addresses the run's rows only


class StepLeaseKeeper:
    """Renews running steps' leases at half their length from one thread per process."""

    def __init__(self, store: WorkflowStore) -> None:
        self._store = store
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, StepHolding]] = []
        self._seq = itertools.count()
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._pid = 0

    def hold(
        self,
        step_id: str,
        attempt: int,
        lease_ms: int,
        claim_id: str | None = None,
        *,
        run_id: str | None = None,
    ) -> StepHolding:
        """Start renewing the lease of a step's attempt (under its claim
        ``claim_id``, in run ``run_id``); the first renewal is due at lease/2."""
        now = time.monotonic()
        holding = StepHolding(
            step_id,
            attempt,
            lease_ms,
            claim_id=claim_id,
            deadline=now + lease_ms / 1000,
            run_id=run_id,
        )
        entry = (now + lease_ms / 2000, next(self._seq), holding)
        with self._cond:
            self._ensure_thread()
            heapq.heappush(self._heap, entry)
            if self._heap[0] is entry:
                # Only an earlier deadline needs the thread awake: otherwise it
                # already sleeps until something due sooner.
                self._cond.notify()
        return holding

    def drop(self, holding: StepHolding) -> None:
        """Stop renewing (the step's body ended); cheap, so a short step costs no write."""
        # Lazy removal: the thread skips dropped holdings when they come due;
        # with long leases they would pile up, so compact once they dominate.
        holding.dropped = True
        with self._cond:
            self._dropped += 1
            if self._dropped > 64 and self._dropped * 2 > len(self._heap):
                self._heap = [e for e in self._heap if not e[2].dropped]
                heapq.heapify(self._heap)
                self._dropped = 0

    def kept(self) -> list[StepHolding]:
        """The holdings the keeper keeps now: those it renews, and dropped ones
        not forgotten yet (a drop is forgotten lazily, in bulk)."""
        with self._cond:
            return [entry[2] for entry in self._heap]

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="pikku-step-leases", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                due, _, holding = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0 and not holding.dropped:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if holding.dropped:
                    self._dropped = max(0, self._dropped - 1)
            if holding.dropped:
                continue
            next_due = self._renew(holding)
            if next_due is not None:
                with self._cond:
                    heapq.heappush(self._heap, (next_due, next(self._seq), holding))

    def _renew(self, holding: StepHolding) -> float | None:
        started = time.monotonic()
        half = holding.lease_ms / 2000
        if started >= holding.renew_until:
            # Its body ran past its time limit and has not ended: the lease
            # lapses, and the sweep hands the step to another attempt.
            log.warning(
                "step %s attempt %d ran past its time limit: its lease is no longer renewed",
                holding.step_id,
                holding.attempt,
            )
            return None
        try:
            ok = self._store.refresh_step_lease(
                holding.step_id,
                holding.attempt,
                holding.lease_ms,
                holding.claim_id,
                run_id=holding.run_id,
            )
        except Exception as exc:
            if time.monotonic() >= holding.deadline:
                log.warning("step %s lost its lease: store unreachable", holding.step_id)
                holding.lost.set()
                return None
            log.info("renewing step %s failed, retrying: %s", holding.step_id, exc)
            return time.monotonic() + min(half / 2, max(0.05, holding.deadline - time.monotonic()))
        if not ok and holding.dropped:
            return None  # the outcome was written meanwhile: nothing was lost
        if not ok:
            log.warning(
                "step %s attempt %d lost its lease: another attempt (or claim) owns it",
                holding.step_id,
                holding.attempt,
            )
            holding.lost.set()
            return None
        holding.renewals += 1
        holding.deadline = started + holding.lease_ms / 1000
        return started + half
