"""The store's kept views (claim views, new runs, passed runs) under threads.

A Celery threads pool shares one store between threads: keeping a view and
dropping the oldest must not fail while another thread does the same.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest

from pikku_celery.store.sql import CLAIM_VIEWS_KEPT, _remember


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
