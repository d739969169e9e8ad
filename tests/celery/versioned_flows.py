"""A workflow whose code changes between worker restarts, for the versioning tests.

``PIKKU_T_FLOW_CODE`` picks the code a process runs (the test process and its
workers alike), as a deploy would change it:

- ``old``: ``t.versioned`` as first deployed: a, b, c, a wait for signal
  ``go``, d (no version given: runs record a hash of the body);
- ``patched``: the change (``x`` inserted before ``b``, ``b`` renamed ``b2``,
  ``c`` removed), each part guarded by ``ctx.patched``;
- ``new``: the same change unguarded;
- ``pinned-old``: ``t.pinned``, the old body as version ``"1"``;
- ``pinned-both``: version ``"1"`` and the new body as version ``"2"``;
- ``pinned-new``: version ``"2"`` alone (a worker lacking version ``"1"``).
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from pikku_celery import Context, Pikku

CODES = ("old", "patched", "new", "pinned-old", "pinned-both", "pinned-new")
VERSIONED, PINNED = "t.versioned", "t.pinned"


def install(app: Celery, pikku: Pikku, code: str) -> None:
    """Register the tasks every code uses and the bodies ``code`` has."""
    if code not in CODES:
        raise ValueError(f"PIKKU_T_FLOW_CODE must be one of {CODES}, not {code!r}")
    tasks = {}
    for step in ("a", "b", "b2", "c", "x", "d"):

        def run(_step: str = step) -> str:
            return _step

        tasks[step] = app.task(name=f"v.{step}", shared=False)(run)

    def old(ctx: Context, _: Any = None) -> list[Any]:
        done = [ctx.step(s, tasks[s]) for s in ("a", "b", "c")]
        ctx.wait_for_signal("go")
        return [*done, ctx.step("d", tasks["d"])]

    def new(ctx: Context, _: Any = None) -> list[Any]:
        done = [ctx.step(s, tasks[s]) for s in ("a", "x", "b2")]
        ctx.wait_for_signal("go")
        return [*done, ctx.step("d", tasks["d"])]

    def patched(ctx: Context, _: Any = None) -> list[Any]:
        done = [ctx.step("a", tasks["a"])]
        if ctx.patched("insert-x"):
            done.append(ctx.step("x", tasks["x"]))
        if ctx.patched("rename-b"):
            done.append(ctx.step("b2", tasks["b2"]))
        else:
            done.append(ctx.step("b", tasks["b"]))
        if not ctx.patched("remove-c"):
            done.append(ctx.step("c", tasks["c"]))
        ctx.wait_for_signal("go")
        return [*done, ctx.step("d", tasks["d"])]

    if code in ("old", "patched", "new"):
        pikku.workflow(name=VERSIONED)({"old": old, "patched": patched, "new": new}[code])
        return
    if code != "pinned-new":
        pikku.workflow(name=PINNED, version="1")(old)
    if code != "pinned-old":
        pikku.workflow(name=PINNED, version="2")(new)
