"""A run's history read a page at a time: ``RunHandle.steps(after=, limit=)``."""

from __future__ import annotations

import pytest

from pikku_celery.engine import Context

from .conftest import Harness


def test_steps_pages_through_a_history_with_each_steps_attempts(h: Harness) -> None:
    @h.task
    def flaky(i: int) -> int:
        if i == 3 and h.count("flaky-3") < 2:
            raise ConnectionError("busy")
        return i

    @h.workflow
    def many(ctx: Context, n: int) -> int:
        return sum(ctx.step(f"s{i}", flaky, i, retries=2, retry_delay=0.01) for i in range(n))

    run = many.start(7)
    h.run()
    assert run.wait(timeout=10) == 21
    whole = run.steps()
    assert [s.step.name for s in whole] == [f"s{i}" for i in range(7)]

    pages, after = [], None
    while True:
        page = run.steps(after=after, limit=3)
        if not page:
            break
        assert len(page) <= 3
        pages.append(page)
        after = page[-1].step.seq
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [s for p in pages for s in p] == whole  # attempts included, as read whole
    assert [a.attempt for a in whole[3].attempts] == [1, 2]
    assert run.steps(after=whole[4].step.seq) == whole[5:]


def test_a_bad_page_is_refused(h: Harness) -> None:
    @h.workflow
    def empty(ctx: Context) -> int:
        return 1

    run = empty.start()
    with pytest.raises(ValueError, match="limit"):
        run.steps(limit=0)
    with pytest.raises(ValueError, match="after"):
        run.steps(after=-1)
