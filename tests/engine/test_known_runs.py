"""The engine's known runs (what passes left, for the claims that follow) under threads.

A Celery threads pool shares one engine between threads: keeping a view and
dropping the oldest must not fail while another thread does the same. The
views hold their runs' inputs (up to max_input_bytes each), so they are
bounded by count and by the bytes those inputs take. A view handed to a pass
stands in for its read only while it is surely current.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from pikku_celery.engine.known_runs import KNOWN_INPUT_BYTES, KNOWN_KEPT, KnownRuns
from pikku_celery.model.plan import PassView, kept_view
from pikku_celery.store import RunState, RunStatus


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Switch threads as often as the interpreter can, to widen every race."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


THREADS = 8


def race(work: Callable[[int], None]) -> list[BaseException]:
    """``work(n)`` on THREADS threads at once; what any of them raised."""
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException as exc:  # any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


RUN = RunState(id="r", workflow="wf", status=RunStatus.RUNNING, input=None)


def passed(size: int) -> PassView:
    return kept_view(RUN, [], {}, 1_000, size, 2_000)


def test_passed_runs_keep_at_most_their_count_oldest_first() -> None:
    memo = KnownRuns()
    for i in range(KNOWN_KEPT + 10):
        memo.put(f"s{i}", passed(1))
    assert [memo.take(f"s{i}") for i in range(10)] == [None] * 10  # pushed out
    assert all(memo.take(f"s{i}") is not None for i in range(10, KNOWN_KEPT + 10))
    assert memo.input_bytes == 0


def test_passed_runs_keep_at_most_their_inputs_bytes() -> None:
    memo = KnownRuns()
    big = KNOWN_INPUT_BYTES // 4
    for i in range(6):
        memo.put(f"s{i}", passed(big))
    assert memo.take("s0") is None and memo.take("s1") is None  # pushed out by bytes
    assert memo.input_bytes == 4 * big
    memo.put("huge", passed(KNOWN_INPUT_BYTES * 2))  # alone over budget: kept alone
    assert memo.take("s5") is None
    assert memo.take("huge") is not None
    assert memo.input_bytes == 0


def test_threads_putting_and_taking_passed_runs_keep_the_count_of_bytes(
    frequent_switches: None,
) -> None:
    memo = KnownRuns()

    def work(n: int) -> None:
        for i in range(20_000):
            memo.put(f"{n}-{i}", passed(1 + i % 7))
            if i % 2:
                memo.take(f"{n}-{i - 1}")

    assert race(work) == []
    assert len(memo) <= KNOWN_KEPT
    assert memo.input_bytes == memo.counted_bytes()


def test_a_passed_run_kept_again_for_the_same_step_is_counted_once() -> None:
    memo = KnownRuns()
    memo.put("s", passed(10))
    memo.put("s", passed(30))  # a pass of the same step again (its retry)
    assert memo.input_bytes == 30
    taken = memo.take("s")
    assert taken is not None and taken.input_size == 30
    assert memo.input_bytes == 0


def test_a_kept_view_stands_in_for_a_read_only_until_its_end() -> None:
    view = kept_view(RUN, [], {}, 1_000, 0, 1_000 + 10_000)
    kept = view.kept("r")
    assert kept is not None and kept.view.now >= 1_000  # "now" moves on
    assert view.kept("another run") is None
    assert kept_view(RUN, [], {}, 1_000, 0, 1_000).kept("r") is None  # at its end
    assert PassView(view.view).kept("r") is None  # a read, not a kept view


def test_the_stores_clock_is_trusted_moved_on_then_forgotten() -> None:
    runs = KnownRuns()
    assert runs.clock() is None
    runs.saw_clock(5_000)
    now = runs.clock()
    assert now is not None and 5_000 <= now < 6_000
    runs.clear()
    assert runs.clock() is None and len(runs) == 0


def test_a_claim_with_no_view_of_its_own_starts_from_its_runs_latest() -> None:
    runs = KnownRuns()
    first, latest = passed(1), passed(2)
    runs.put("step-1", first)
    runs.keep_latest(latest)
    assert runs.for_claim("step-1", RUN.id) is first  # the pass that published it
    assert runs.for_claim("step-1", RUN.id) is latest  # taken once; then the run's
    assert runs.for_claim("step-2", RUN.id) is latest  # kept for every later claim
    assert runs.for_claim("step-2", "another run") is None
    assert runs.for_claim("step-2", None) is None  # a message that names no run
    newer = passed(3)
    runs.keep_latest(newer)
    assert runs.for_claim("step-3", RUN.id) is newer
