"""The store's kept views (claim views, new runs, passed runs) under threads.

A Celery threads pool shares one store between threads: keeping a view and
dropping the oldest must not fail while another thread does the same. The
passed runs hold their runs' inputs (up to max_input_bytes each), so they are
bounded by count and by the bytes those inputs take.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pikku_celery.store import RunState, RunStatus
from pikku_celery.store.kept_views import (
    CLAIM_VIEWS_KEPT,
    PASSED_INPUT_BYTES,
    PASSED_KEPT,
    Passed,
    PassedRuns,
    remember,
)


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


def test_threads_keeping_views_at_the_limit_never_fail(frequent_switches: None) -> None:
    views: OrderedDict[Any, Any] = OrderedDict((("old", i), i) for i in range(CLAIM_VIEWS_KEPT))

    def keep(n: int) -> None:
        for i in range(100_000):
            remember(views, (n, i), i)

    assert race(keep) == []
    assert len(views) <= CLAIM_VIEWS_KEPT + THREADS  # trimmed, give or take a race


def passed(size: int) -> Passed:
    run = RunState(id="r", workflow="wf", status=RunStatus.RUNNING, input=None)
    return Passed(run, [], size, False)


def test_passed_runs_keep_at_most_their_count_oldest_first() -> None:
    memo = PassedRuns()
    for i in range(PASSED_KEPT + 10):
        memo.put(f"s{i}", passed(1))
    assert [memo.take(f"s{i}") for i in range(10)] == [None] * 10  # pushed out
    assert all(memo.take(f"s{i}") is not None for i in range(10, PASSED_KEPT + 10))
    assert memo.input_bytes == 0


def test_passed_runs_keep_at_most_their_inputs_bytes() -> None:
    memo = PassedRuns()
    big = PASSED_INPUT_BYTES // 4
    for i in range(6):
        memo.put(f"s{i}", passed(big))
    assert memo.take("s0") is None and memo.take("s1") is None  # pushed out by bytes
    assert memo.input_bytes == 4 * big
    memo.put("huge", passed(PASSED_INPUT_BYTES * 2))  # alone over budget: kept alone
    assert memo.take("s5") is None
    assert memo.take("huge") is not None
    assert memo.input_bytes == 0


def test_threads_putting_and_taking_passed_runs_keep_the_count_of_bytes(
    frequent_switches: None,
) -> None:
    memo = PassedRuns()

    def work(n: int) -> None:
        for i in range(20_000):
            memo.put(f"{n}-{i}", passed(1 + i % 7))
            if i % 2:
                memo.take(f"{n}-{i - 1}")

    assert race(work) == []
    assert len(memo) <= PASSED_KEPT
    assert memo.input_bytes == memo.counted_bytes()


def test_a_passed_run_kept_again_for_the_same_step_is_counted_once() -> None:
    memo = PassedRuns()
    memo.put("s", passed(10))
    memo.put("s", passed(30))  # a pass of the same step again (its retry)
    assert memo.input_bytes == 30
    taken = memo.take("s")
    assert taken is not None and taken.input_size == 30
    assert memo.input_bytes == 0
