"""A parked body that continues as new decides what a replay of the same view decides."""

from __future__ import annotations

from typing import Any

import pytest

from pikku_celery.engine import Context
from pikku_celery.testing import InlineDispatcher, make_engine
from tests.resume.conftest import Passes, passes  # noqa: F401 - a fixture


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "broker"])
def test_a_resumed_body_continues_as_a_replayed_one_would(
    eager: bool,
    passes: Passes,  # noqa: F811
) -> None:
    engine, inline = make_engine(dispatcher=InlineDispatcher(eager=eager))

    @inline.task
    def inc(x: int) -> int:
        return x + 1

    @engine.workflow(name="rounds")
    def rounds(ctx: Context, state: dict[str, int]) -> Any:
        x = state["x"]
        for i in range(5):
            x = ctx.step(f"s{i}", inc, x)
        if state["left"] > 0:
            ctx.continue_as_new({"x": x, "left": state["left"] - 1})
        return x

    run = rounds.start({"x": 0, "left": 2})
    inline.run_until_idle()
    assert run.wait(timeout=5) == 15
    assert passes.mismatches == []
    assert passes.resumed >= 6, passes  # most passes resumed a parked body
