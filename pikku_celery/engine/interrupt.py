"""Interrupting a step's body in its own thread when its time limit passes.

Celery enforces ``time_limit`` per message (a prefork pool kills the child
process), which an eager step, running inside another step's message, cannot
carry. Here one watch thread per process raises an exception *inside* the
thread that runs the body (``PyThreadState_SetAsyncExc``): the soft limit's
once, the hard limit's :class:`StepTimeLimitExceeded` again every
``REPEAT`` seconds until the body ends. A body blocked in C code sees it
when it returns to Python; one that never does is dealt with by its lease,
which is no longer renewed past the hard limit (:mod:`.keeper`).
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, TypeVar, runtime_checkable

from ..errors import StepTimeLimitExceeded
from ..model.values import StepState

T = TypeVar("T")

REPEAT = 1.0
"""How often the hard limit's exception is raised again in a body that caught it."""


@dataclass(frozen=True)
class TimeLimits:
    """An attempt's limits in seconds from its start; ``soft_error`` is what
    the soft limit raises in the body (Celery's ``SoftTimeLimitExceeded`` for
    a task's ``soft_time_limit``)."""

    soft: float | None = None
    hard: float | None = None
    soft_error: type[BaseException] = TimeoutError

    @classmethod
    def of(
        cls,
        soft: float | None,
        hard: float | None,
        soft_error: type[BaseException] = TimeoutError,
    ) -> TimeLimits | None:
        """The limits, or None when neither is set; a soft limit at or past
        the hard one is dropped (the hard one ends the attempt first)."""
        if soft is not None and hard is not None and soft >= hard:
            soft = None
        if soft is None and hard is None:
            return None
        return cls(soft, hard, soft_error)

    def tighter(self, other: TimeLimits | None) -> TimeLimits:
        """The earlier of each limit of ``self`` and ``other``."""
        if other is None:
            return self
        merged = TimeLimits.of(
            _earlier(self.soft, other.soft),
            _earlier(self.hard, other.hard),
            other.soft_error if other.soft is not None else self.soft_error,
        )
        assert merged is not None
        return merged


def _earlier(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


@runtime_checkable
class TimedBody(Protocol):
    """A step body that brings limits of its own (a Celery task's time limits)."""

    def time_limits(self, step: StepState) -> TimeLimits | None:
        """The limits of running ``step`` here, None for none."""
        ...


_TIMED: dict[type, bool] = {}


def brings_limits(body: object) -> TypeGuard[TimedBody]:
    """Whether ``body`` is a :class:`TimedBody`, checked once per type (a
    runtime protocol check costs microseconds, on every step)."""
    kind = type(body)
    known = _TIMED.get(kind)
    if known is None:
        known = _TIMED[kind] = isinstance(body, TimedBody)
    return known


@dataclass(eq=False)
class Watch:
    """One armed attempt: the thread it interrupts and what it raised."""

    thread_id: int
    limits: TimeLimits
    armed: bool = True
    soft_fired: bool = False
    hard_fired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def _raise_in(thread_id: int, exc: type[BaseException] | None) -> None:
    """Ask the thread to raise ``exc`` at its next bytecode (None: forget a pending one)."""
    obj = ctypes.py_object(exc) if exc is not None else None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), obj)


class Watcher:
    """One thread per process that fires the armed limits when they come due."""

    def __init__(self, repeat: float = REPEAT) -> None:
        self.repeat = repeat
        """How often the hard limit's exception is raised again in a body that caught it."""
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch, bool]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._disarmed = 0
        self._sleep_until = float("inf")  # monotonic: when the thread wakes up next

    def run(self, limits: TimeLimits, fn: Callable[[], T]) -> T:
        """``fn()`` in this thread under ``limits``; raises
        :class:`StepTimeLimitExceeded` if the hard limit passed, whatever
        ``fn`` did meanwhile."""
        watch = self.arm(limits)
        try:
            result = fn()
        except StepTimeLimitExceeded:
            self.disarm(watch)
            raise
        except BaseException:
            if self.disarm(watch):
                raise StepTimeLimitExceeded() from None
            raise
        if self.disarm(watch):
            raise StepTimeLimitExceeded()
        return result

    def arm(self, limits: TimeLimits) -> Watch:
        """Start watching the calling thread under ``limits``."""
        watch = Watch(threading.get_ident(), limits)
        now = time.monotonic()
        with self._cond:
            self._ensure_thread()
            if limits.soft is not None:
                self._push(now + limits.soft, watch, False)
            if limits.hard is not None:
                self._push(now + limits.hard, watch, True)
        return watch

    def disarm(self, watch: Watch) -> bool:
        """Stop watching; True if the hard limit fired. Called by the watched
        thread, in which an exception raised meanwhile may still arrive: it is
        taken here, never let out into the caller's code."""
        while True:
            try:
                with watch.lock:
                    watch.armed = False
                    if watch.soft_fired or watch.hard_fired:
                        _raise_in(watch.thread_id, None)
                break
            except (StepTimeLimitExceeded, watch.limits.soft_error):
                continue
        self._compact()
        return watch.hard_fired

    def _compact(self) -> None:
        """Disarmed watches leave the heap when due; with long limits they
        would pile up, so they are swept out once they are most of it."""
        with self._cond:
            self._disarmed += 1
            if self._disarmed > 64 and self._disarmed * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2].armed]
                heapq.heapify(self._heap)
                self._disarmed = 0

    def _push(self, due: float, watch: Watch, hard: bool) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), watch, hard))
        # Wake the thread only for a limit due before the time it sleeps
        # until: a wake-up per step would cost every step a thread switch.
        if due < self._sleep_until:
            self._sleep_until = due
            self._cond.notify()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
            return
        self._pid = os.getpid()
        self._heap = []
        self._sleep_until = float("inf")
        self._thread = threading.Thread(target=self._loop, name="pikku-time-limits", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._sleep_until = float("inf")
                    self._cond.wait()
                due, _, watch, hard = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    # A disarmed watch stays until due (or compacted away):
                    # popping it now would only wake the thread for the next.
                    self._sleep_until = due
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if watch.armed and self._fire(watch, hard) and hard:
                    self._push(time.monotonic() + self.repeat, watch, True)

    @staticmethod
    def _fire(watch: Watch, hard: bool) -> bool:
        with watch.lock:
            if not watch.armed:
                return False
            if hard:
                watch.hard_fired = True
                _raise_in(watch.thread_id, StepTimeLimitExceeded)
            elif not watch.hard_fired:
                watch.soft_fired = True
                _raise_in(watch.thread_id, watch.limits.soft_error)
            return True


WATCHER = Watcher()
"""The process's watcher (its thread starts with the first limit, again after a fork)."""
