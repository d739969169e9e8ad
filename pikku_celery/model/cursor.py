"""Where a page of runs ends: the keyset the next page starts after.

Runs are listed newest first by ``(created_at, id)``; a page's cursor is its
last run's pair, and the next page holds the runs strictly before it. Unlike
an offset, reading page 1,000 costs what page 1 costs, and runs started
meanwhile never shift a page. As text the cursor is ``<created_at>.<id>``:
treat it as opaque.
"""

from __future__ import annotations

from dataclasses import dataclass

from .values import RunState

COUNT_CAP = 10_000
"""The most runs a listing counts per status; past it the count reads "10,000+"."""


@dataclass(frozen=True, order=True)
class RunCursor:
    """A position in the runs list: the runs before it are older (or, of one
    ``created_at``, have a smaller id)."""

    created_at: int
    run_id: str

    @classmethod
    def after(cls, run: RunState) -> RunCursor:
        """The cursor of a page whose last run is ``run``."""
        return cls(run.created_at, run.id)

    @classmethod
    def parse(cls, text: str) -> RunCursor:
        """A cursor from its text (:meth:`__str__`); ``ValueError`` if it is not one."""
        stamp, sep, run_id = text.strip().partition(".")
        if not sep or not run_id or not (stamp.isascii() and stamp.isdigit()) or len(stamp) > 18:
            raise ValueError(f"{text[:80]!r} is not a runs-list cursor (<created_at>.<run id>)")
        return cls(int(stamp), run_id)

    def admits(self, run: RunState) -> bool:
        """Whether ``run`` lies before the cursor (on a later page)."""
        return (run.created_at, run.id) < (self.created_at, self.run_id)

    def __str__(self) -> str:
        return f"{self.created_at}.{self.run_id}"
