"""The Celery app of the resumed-body tests on real workers: the eager-step
app (:mod:`tests.celery.eagerapp`) plus a run long enough to move between
processes half-way. Each time a process starts the body from the top (a
replay, not a resume) it appends its pid to ``<key>.bodies`` in
``PIKKU_T_MARKS``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pikku_celery import Context
from tests.celery import eagerapp, realapp

HALF = 6


def build(env: Mapping[str, str]) -> realapp.TestApp:
    t = eagerapp.build(env)
    marks = Path(env.get("PIKKU_T_MARKS", "/tmp"))

    @t.pikku.workflow(name="r.moving")
    def moving(ctx: Context, key: str) -> int:
        with open(marks / f"{key}.bodies", "a") as starts:
            starts.write(f"{os.getpid()}\n")
        x = 0
        for i in range(HALF):
            x = ctx.step(f"a{i}", "e.ledger_add", f"{key}:a{i}", x)
        x = ctx.step("hang", "e.hang_first", key, x, retries=2)
        for i in range(HALF):
            x = ctx.step(f"b{i}", "e.ledger_add", f"{key}:b{i}", x)
        return x

    t.workflows["moving"] = moving
    return t


if os.environ.get("PIKKU_T_BROKER"):
    _built = build(os.environ)
    app = _built.app
