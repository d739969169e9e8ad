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
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery.store import RunState, RunStatus
from pikku_celery.store.sql import (
    CLAIM_VIEWS_KEPT,
    PASSED_INPUT_BYTES,
    PASSED_KEPT,
    _Passed,
    _PassedRuns,
    _remember,
)


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    """Switch threads as often as the interpreter can, to widen every race."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_threads_keeping_views_at_the_limit_never_fail(frequent_switches: None) -> None:
    views: OrderedDict[Any, Any] = OrderedDict((("old", i), i) for i in range(CLAIM_VIEWS_KEPT))
    errors: list[BaseException] = []

    def keep(n: int) -> None:
        try:
            for i in range(100_000):
                _remember(views, (n, i), i)
        except BaseException as exc:  # any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=keep, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(views) <= CLAIM_VIEWS_KEPT + len(threads)  # trimmed, give or take a race


def passed(size: int) -> _Passed:
    run = RunState(id="r", workflow="wf", status=RunStatus.RUNNING, input=None)
    return _Passed(run, [], size)


def test_passed_runs_keep_at_most_their_count_oldest_first() -> None:
    memo = _PassedRuns()
    for i in range(PASSED_KEPT + 10):
        memo.put(f"s{i}", passed(1))
    assert [memo.take(f"s{i}") for i in range(10)] == [None] * 10  # pushed out
    assert all(memo.take(f"s{i}") is not None for i in range(10, PASSED_KEPT + 10))
    assert memo._input_bytes == 0


def test_passed_runs_keep_at_most_their_inputs_bytes() -> None:
    memo = _PassedRuns()
    big = PASSED_INPUT_BYTES // 4
    for i in range(6):
        memo.put(f"s{i}", passed(big))
    assert memo.take("s0") is None and memo.take("s1") is None  # pushed out by bytes
    assert memo._input_bytes == 4 * big
    memo.put("huge", passed(PASSED_INPUT_BYTES * 2))  # alone over budget: kept alone
    assert memo.take("s5") is None
    assert memo.take("huge") is not None
    assert memo._input_bytes == 0


def test_threads_putting_and_taking_passed_runs_keep_the_count_of_bytes(
    frequent_switches: None,
) -> None:
    memo = _PassedRuns()
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20_000):
                memo.put(f"{n}-{i}", passed(1 + i % 7))
                if i % 2:
                    memo.take(f"{n}-{i - 1}")
        except BaseException as exc:  # any failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(memo._kept) <= PASSED_KEPT
    assert memo._input_bytes == sum(p.input_size for p in memo._kept.values())
