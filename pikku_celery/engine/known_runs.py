"""What this worker process last saw of runs, so a claim or a first pass skips its read.

The engine's one per-process cache, and its only owner: the run as a landed
pass left it, by the one step that pass published (that step's claim, when
its message lands in this process, reads no run of its own) and by the run
(the latest pass's view, for the claims of steps an earlier pass published:
a wide fan-out's branches), and the store's clock as last read (a new run's
creation time needs no read of it). Every pass's write is version-checked,
so a stale entry costs a retry, never a wrong write. A step's entry leaves
when taken; a run's when a newer pass replaces it; the oldest go once the
cache is full.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from ..model.plan import PassView

KNOWN_KEPT = 256
KNOWN_INPUT_BYTES = 32 * 1024 * 1024
CLOCK_TRUSTED_MS = 10_000  # a reading of the store's clock moved on for this long
RUN_KEY = "run:"  # a run's latest view is kept under its id with this prefix


class KnownRuns:
    """Views of runs by the step whose claim will use them, and the store's clock.

    In a prefork pool about half the published steps land in another
    process, so their entries stay until pushed out: the oldest go once
    KNOWN_KEPT are kept, or once the inputs they hold pass KNOWN_INPUT_BYTES.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[str, PassView] = OrderedDict()
        self._input_bytes = 0
        self._lock = threading.Lock()  # a threads pool shares the engine
        self._clock: tuple[int, float] | None = None

    def put(self, step_id: str, view: PassView) -> None:
        """Keep the run as a pass left it, for the claim of ``step_id``."""
        with self._lock:
            old = self._kept.pop(step_id, None)
            if old is not None:
                self._input_bytes -= old.input_size
            self._kept[step_id] = view
            self._input_bytes += view.input_size
            while len(self._kept) > KNOWN_KEPT or (
                self._input_bytes > KNOWN_INPUT_BYTES and len(self._kept) > 1
            ):
                _, dropped = self._kept.popitem(last=False)
                self._input_bytes -= dropped.input_size

    def keep_latest(self, view: PassView) -> None:
        """Keep the run as its latest landed pass left it (for any claim)."""
        self.put(RUN_KEY + view.view.run.id, view)

    def for_claim(self, step_id: str, run_id: str | None) -> PassView | None:
        """The view kept for the claim of ``step_id`` (once), else the run's
        latest (kept for the next claims too), else None."""
        view = self.take(step_id)
        if view is not None or run_id is None:
            return view
        with self._lock:
            return self._kept.get(RUN_KEY + run_id)

    def take(self, step_id: str) -> PassView | None:
        """The view kept for the claim of ``step_id`` (once), or None."""
        with self._lock:
            view = self._kept.pop(step_id, None)
            if view is not None:
                self._input_bytes -= view.input_size
            return view

    def clear(self) -> None:
        """Forget everything (a process that forked, a store swapped)."""
        with self._lock:
            self._kept.clear()
            self._input_bytes = 0
            self._clock = None

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def input_bytes(self) -> int:
        """The bytes of the inputs kept, as counted."""
        return self._input_bytes

    def counted_bytes(self) -> int:
        """The bytes of the inputs kept, summed afresh (to check the count)."""
        with self._lock:
            return sum(v.input_size for v in self._kept.values())

    # --- the store's clock ---------------------------------------------------
    def saw_clock(self, store_now: int) -> None:
        """The store said it was ``store_now`` (epoch ms) just now."""
        self._clock = (store_now, time.monotonic())

    def clock(self) -> int | None:
        """The store's clock now, or None without a recent reading."""
        read = self._clock
        if read is None:
            return None
        elapsed = int((time.monotonic() - read[1]) * 1000)
        return None if elapsed > CLOCK_TRUSTED_MS else read[0] + elapsed
