"""The run page's API shows a long history a page of steps at a time."""

from __future__ import annotations

from typing import Any

import pytest

from pikku_celery import Context
from pikku_celery.engine import WorkflowEngine
from pikku_celery.testing import make_engine
from pikku_celery.web.api import RunApi
from pikku_celery.web.permissions import allow_all
from pikku_celery.web.reads import MAX_STEPS_LIMIT, STEPS_LIMIT


@pytest.fixture
def long_run() -> tuple[WorkflowEngine, str]:
    """A finished run of seven steps, the fourth of which took two attempts."""
    engine, dispatcher = make_engine()
    tries: list[int] = []

    @dispatcher.task(name="pages.work")
    def work(i: int) -> int:
        if i == 3 and not tries:
            tries.append(i)
            raise ConnectionError("busy")
        return i

    @engine.workflow(name="pages")
    def pages(ctx: Context, n: int) -> int:
        return sum(ctx.step(f"s{i}", work, i, retries=2, retry_delay=0.01) for i in range(n))

    run_id = engine.start("pages", 7).run_id
    dispatcher.run_until_idle()
    return engine, run_id


def _page(engine: WorkflowEngine, run_id: str, **query: str) -> dict[str, Any]:
    answer = RunApi(engine, allow_all).run(run_id, query)
    assert answer.status == 200, answer
    return answer.body


def test_the_steps_come_a_page_at_a_time_with_the_runs_counts_whole(
    long_run: tuple[WorkflowEngine, str],
) -> None:
    engine, run_id = long_run
    whole = _page(engine, run_id)
    assert whole["steps_limit"] == STEPS_LIMIT and whole["next_steps"] is None
    names, after, seen = [], None, []
    while True:
        query = {"steps_limit": "3"} | ({} if after is None else {"steps_after": str(after)})
        page = _page(engine, run_id, **query)
        assert len(page["steps"]) <= 3
        assert page["steps_total"] == 7 and page["step_counts"]["succeeded"] == 7
        names += [s["name"] for s in page["steps"]]
        seen += page["steps"]
        after = page["next_steps"]
        if after is None:
            break
    assert names == [f"s{i}" for i in range(7)]
    assert seen == whole["steps"]  # each step with its attempts, as shown whole
    assert [a["attempt"] for a in seen[3]["attempts"]] == [1, 2]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"steps_limit": "0"}, "steps_limit must be from 1"),
        ({"steps_limit": str(MAX_STEPS_LIMIT + 1)}, "steps_limit must be from 1"),
        ({"steps_limit": "ten"}, "steps_limit='ten' is not a whole number"),
        ({"steps_after": "-1"}, "steps_after='-1' is not a whole number"),
    ],
)
def test_a_bad_page_of_steps_is_a_400_naming_the_key(
    long_run: tuple[WorkflowEngine, str], query: dict[str, str], message: str
) -> None:
    engine, run_id = long_run
    answer = RunApi(engine, allow_all).run(run_id, query)
    assert answer.status == 400 and answer.body["error"] == "invalid_query"
    assert message in answer.body["message"]
