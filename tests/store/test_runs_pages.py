"""The runs list pages by keyset and counts up to a cap, on every store.

A user pages through a long list with the cursor of the page before: every
run is shown once, in order, whatever starts meanwhile; the counts beside
the list stop at the cap, and under it are exact.
"""

from __future__ import annotations

import pytest

from pikku_celery.model.cursor import RunCursor
from pikku_celery.store import NewRun, RunStatus, WorkflowStore
from tests.helpers import wait_until
from tests.store.support import record

RUNS = 11


def _start(store: WorkflowStore, n: int) -> list[str]:
    ids = []
    for i in range(n):
        run, _ = store.create_run(NewRun("even" if i % 2 == 0 else "odd", {"i": i}))
        ids.append(run.id)
    return ids


def _pages(store: WorkflowStore, limit: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    before: RunCursor | None = None
    while True:
        page = store.list_runs(limit=limit, before=before, **filters)  # type: ignore[arg-type]
        if not page:
            return pages
        pages.append([r.id for r in page])
        before = RunCursor.after(page[-1])


def test_keyset_pages_show_every_run_once_in_order(store: WorkflowStore) -> None:
    ids = _start(store, RUNS)
    for run_id in ids[::3]:
        record(store, run_id, run_status=RunStatus.COMPLETED, output=1)
    everything = [r.id for r in store.list_runs(limit=1000)]
    assert sorted(everything) == sorted(ids)
    pages = _pages(store, 5)
    assert [len(p) for p in pages] == [5, 5, 1]
    assert [i for p in pages for i in p] == everything
    for filters in ({"workflow": "odd"}, {"status": RunStatus.COMPLETED}):
        whole = [r.id for r in store.list_runs(limit=1000, **filters)]  # type: ignore[arg-type]
        assert [i for p in _pages(store, 4, **filters) for i in p] == whole


def test_a_run_started_between_pages_shifts_no_page(store: WorkflowStore) -> None:
    _start(store, 6)
    first = store.list_runs(limit=3)
    expected = [r.id for r in store.list_runs(limit=3, offset=3)]
    newest = max(r.created_at for r in first)
    wait_until(lambda: store.now_ms() > newest)  # a later millisecond: surely newer
    _start(store, 2)  # newer: they belong before page 1, not on page 2
    second = store.list_runs(limit=3, before=RunCursor.after(first[-1]))
    assert [r.id for r in second] == expected


def test_the_cursor_reads_back_from_its_text() -> None:
    cursor = RunCursor(1_764_000_000_123, "0b5f8a8e-3c1d-4f7e-9a41-2f3f6c1d0e9b")
    assert RunCursor.parse(str(cursor)) == cursor
    for bad in ("", "12", "x.abc", ".abc", "12.", "1" * 19 + ".a"):
        with pytest.raises(ValueError, match="cursor"):
            RunCursor.parse(bad)


def test_capped_counts_stop_at_the_cap_and_are_exact_below(store: WorkflowStore) -> None:
    ids = _start(store, 9)
    for run_id in ids[:2]:
        record(store, run_id, run_status=RunStatus.COMPLETED, output=1)
    exact = store.count_runs_by_status()
    assert store.count_runs_capped() == exact
    capped = store.count_runs_capped(cap=4)
    assert capped[RunStatus.RUNNING] == 5  # seven running: past the cap, cap + 1
    assert capped[RunStatus.COMPLETED] == 2 and capped[RunStatus.FAILED] == 0
    odd = store.count_runs_capped(cap=4, workflow="odd")  # three of them run: under the cap
    assert odd[RunStatus.RUNNING] == 3 and odd[RunStatus.COMPLETED] == 1
    assert store.count_runs_capped(cap=2, workflow="odd")[RunStatus.RUNNING] == 3
    assert store.count_runs_capped(workflow="odd") == store.count_runs_by_status(workflow="odd")
