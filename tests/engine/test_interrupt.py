"""The in-process interrupt: a body is stopped in its own thread at its limits."""

from __future__ import annotations

import threading
import time

import pytest

from pikku_celery.engine.interrupt import WATCHER, TimeLimits, Watcher
from pikku_celery.errors import StepTimeLimitExceeded


class Soft(Exception):
    pass


def test_hard_limit_stops_a_hung_body_within_a_repeat() -> None:
    began = time.monotonic()
    with pytest.raises(StepTimeLimitExceeded):
        WATCHER.run(TimeLimits(hard=0.3), lambda: _forever())
    assert time.monotonic() - began < 0.3 + 1.5


def _forever() -> None:
    while True:
        time.sleep(0.05)


def test_a_body_that_swallows_the_hard_limit_gets_it_again() -> None:
    caught: list[BaseException] = []

    def stubborn() -> None:
        while True:
            try:
                while True:
                    time.sleep(0.01)
            except BaseException as exc:  # a body that catches everything
                caught.append(exc)
                if len(caught) >= 2:
                    raise

    with pytest.raises(StepTimeLimitExceeded):
        Watcher(repeat=0.1).run(TimeLimits(hard=0.1), stubborn)
    assert [type(e) for e in caught] == [StepTimeLimitExceeded, StepTimeLimitExceeded]


def test_soft_limit_raises_its_error_in_the_body_which_may_clean_up() -> None:
    def body() -> str:
        try:
            _forever()
        except Soft:
            return "cleaned up"
        return "never"

    assert WATCHER.run(TimeLimits(soft=0.1, hard=5.0, soft_error=Soft), body) == "cleaned up"


def test_a_body_that_returns_after_its_hard_limit_still_timed_out() -> None:
    def late() -> str:
        try:
            _forever()
        except StepTimeLimitExceeded:
            return "a result produced past the limit"

    with pytest.raises(StepTimeLimitExceeded):
        WATCHER.run(TimeLimits(hard=0.1), late)


def test_a_body_done_in_time_is_never_interrupted_later() -> None:
    assert WATCHER.run(TimeLimits(soft=0.05, hard=0.1), lambda: 7) == 7
    time.sleep(0.3)  # the limits' due times pass here: nothing may be raised now


def test_limits_apply_to_their_own_thread_only() -> None:
    results: dict[str, object] = {}

    def quick() -> None:
        results["quick"] = WATCHER.run(TimeLimits(hard=5.0), lambda: "done")

    def slow() -> None:
        try:
            WATCHER.run(TimeLimits(hard=0.2), _forever)
        except StepTimeLimitExceeded:
            results["slow"] = "stopped"

    threads = [threading.Thread(target=quick), threading.Thread(target=slow)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == {"quick": "done", "slow": "stopped"}


def test_limits_merge_to_the_earlier_of_each() -> None:
    step = TimeLimits.of(None, 3.0)
    task = TimeLimits.of(2.0, 10.0, Soft)
    assert step is not None and step.tighter(task) == TimeLimits(2.0, 3.0, Soft)
    assert TimeLimits.of(5.0, 3.0) == TimeLimits(None, 3.0)
    assert TimeLimits.of(None, None) is None
