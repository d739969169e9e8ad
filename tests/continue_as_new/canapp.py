"""The Celery app of the continue_as_new tests on real workers: the eager-step
app (:mod:`tests.celery.eagerapp`) plus a run that continues as new twice.

In a worker process (``PIKKU_T_BROKER`` set) with ``PIKKU_T_KILL_CONTINUE``
set, the first pass that lands a continuation SIGKILLs its own process right
after its commit, before anything is published (marked by
``kill-after-continue`` in ``PIKKU_T_MARKS``, so it happens once)."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pikku_celery import Context
from pikku_celery.model.plan import Moved, PassView, PassWrite
from tests.celery import eagerapp, realapp

ROUNDS = 3
KILLED_MARK = "kill-after-continue"


def build(env: Mapping[str, str]) -> realapp.TestApp:
    t = eagerapp.build(env)

    @t.pikku.workflow(name="c.rolling")
    def rolling(ctx: Context, state: dict[str, Any]) -> int:
        key, round_, x = state["key"], state["round"], state["x"]
        x = ctx.step("a", "e.ledger_add", f"{key}:{round_}:a", x)
        if round_ == 0:  # its first attempt hangs until the test kills its worker
            x = ctx.step("hang", "e.hang_first", key, x, retries=2)
        if round_ < ROUNDS - 1:
            ctx.continue_as_new({"key": key, "round": round_ + 1, "x": x})
        return x

    t.workflows["rolling"] = rolling
    return t


def kill_after_continuing(t: realapp.TestApp, marks: Path) -> None:
    """The store's pass write, SIGKILLing this process once, just after the
    first continuation it commits."""
    store = t.pikku.store
    write = store.write_pass

    def write_then_die(read: PassView, plan: PassWrite) -> Any:
        done = write(read, plan)
        mark = marks / KILLED_MARK
        if plan.successor is not None and not isinstance(done, Moved) and not mark.exists():
            mark.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return done

    store.write_pass = write_then_die  # type: ignore[method-assign]


if os.environ.get("PIKKU_T_BROKER"):
    _built = build(os.environ)
    if os.environ.get("PIKKU_T_KILL_CONTINUE"):
        kill_after_continuing(_built, Path(os.environ["PIKKU_T_MARKS"]))
    app = _built.app
