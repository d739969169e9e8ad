"""Fixtures for resumed bodies: every pass checked against a replay of the same view."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from pikku_celery.engine import choose
from pikku_celery.engine.replay import replay
from pikku_celery.engine.resume import passes as counts
from pikku_celery.engine.resume import release_all
from pikku_celery.model.values import Decision, RunView


def comparable(decision: Decision) -> dict[str, Any]:
    """What a pass decides, less the traceback text (its frames differ by path)."""
    error = decision.error
    return {
        "new_steps": [  # a new child run's id is random: compare the rest
            replace(s, child=None if s.child is None else replace(s.child, id=""))
            for s in decision.new_steps
        ],
        "resolutions": decision.resolutions,
        "redispatch": decision.redispatch,
        "run_status": decision.run_status,
        "output": decision.output,
        "error": None if error is None else (error["type"], error["message"]),
        "wake_at": decision.wake_at,
        "cancel_children": decision.cancel_children,
        "successor": decision.successor,  # continue_as_new: its id is made from the run's
    }


@dataclass
class Passes:
    """How the passes of the test went: resumed (a parked body) or replayed."""

    resumed: int = 0
    replayed: int = 0
    mismatches: list[str] = field(default_factory=list)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> Iterator[Passes]:
    """Every pass's decision checked against a replay from the top over its view."""
    seen = Passes()

    def checked(workflow: Any, view: RunView, *args: Any, **kwargs: Any) -> Decision:
        resumed, _ = counts()
        decided = replay(workflow, view, *args, **kwargs)
        again = replay(workflow, view, *args, **{**kwargs, "resume": False})
        if comparable(decided) != comparable(again):
            seen.mismatches.append(f"{comparable(decided)} != {comparable(again)}")
        if counts()[0] > resumed:
            seen.resumed += 1
        else:
            seen.replayed += 1
        return decided

    release_all()
    monkeypatch.setattr(choose, "replay", checked)
    yield seen
    release_all()
