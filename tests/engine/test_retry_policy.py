"""The one retry policy: what it calls again, and when it stops."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pikku_celery.retry import ROLLED_BACK, RetryPolicy


class Passing(Exception):
    """A failure worth another call."""


class Lasting(Exception):
    """A failure no other call will cure."""


def failing(times: int, exc: type[Exception] = Passing) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc("no")
        return "done"

    return calls, fn


def is_passing(exc: BaseException) -> bool:
    return isinstance(exc, Passing)


def test_a_passing_failure_is_called_again_until_it_clears() -> None:
    calls, fn = failing(3)
    seen: list[BaseException] = []
    assert RetryPolicy(attempts=5).call(fn, is_passing, seen.append) == "done"
    assert len(calls) == 4 and len(seen) == 3


def test_the_count_bounds_the_calls_and_the_last_error_is_raised() -> None:
    calls, fn = failing(10)
    with pytest.raises(Passing):
        ROLLED_BACK.call(fn, is_passing)
    assert len(calls) == ROLLED_BACK.attempts


def test_a_lasting_failure_is_raised_at_once() -> None:
    calls, fn = failing(1, Lasting)
    with pytest.raises(Lasting):
        RetryPolicy(attempts=5).call(fn, is_passing)
    assert len(calls) == 1


def test_no_new_call_once_the_time_bound_has_passed() -> None:
    calls, fn = failing(10)
    with pytest.raises(Passing):
        RetryPolicy(within=0.0).call(fn, is_passing)
    assert len(calls) == 1
