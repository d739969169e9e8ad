"""One step's path through pikku, as function hops: Celery task → SQL → publish.

An in-process Celery worker (``--pool solo`` in a thread; in-memory broker,
an SQLite or PostgreSQL store) runs a 4-step workflow twice, eager steps and
broker steps. While the second run goes, a profiler records every call made
in pikku's modules, every SQL statement SQLAlchemy executes and every message
kombu publishes, in the worker's thread. The third step is then cut out of
the record: for a broker step, the whole of its message's task (the claim,
the body, the pass, the publish of the next step); for an eager step, from the
return of its body to the start of the next one's (the pass that records it
and claims the next). Printed per path: the modules in the order the step
first enters them, the count of modules crossed, of pikku function calls, of
SQL statements and of publishes, and every call from a store module up
into the engine or Celery (there should be none: control runs one way).

Public API only, so the same script runs on any checkout of the project:

    python benchmarks/step_path.py [--database URL]   (a migrated database;
                                                      default: an SQLite file)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker

from pikku_celery import Context, Pikku

# What the store may call: itself and the layers below it (docs/layers.md).
DOWN_FROM_STORE = tuple(
    f"pikku_celery.{name}"
    for name in ("store", "sql", "model", "ports", "payload", "retry", "names", "errors", "lazy")
)
BODY = "path_inc"  # the step task's body: its calls mark where a step's own code runs


@dataclass
class Record:
    """What the worker's thread called while on, in order: (kind, module, function).

    The hook is set for every thread before the worker starts (a running
    thread's profiler cannot be set from outside); it records only while
    ``on``, and only in the thread that runs Celery's tasks."""

    events: list[tuple[str, str, str]] = field(default_factory=list)
    thread: int | None = None
    on: bool = False
    upward: list[str] = field(default_factory=list)  # a store function calling above the store

    def hook(self, frame: FrameType, event: str, _: object) -> None:
        if not self.on or event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        name = frame.f_code.co_name
        if self.thread is None:
            if module != "celery.app.trace" or name != "trace_task":
                return
            self.thread = threading.get_ident()
        elif threading.get_ident() != self.thread:
            return
        if module.startswith("pikku_celery"):
            caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
            if caller.startswith("pikku_celery.store") and not module.startswith(DOWN_FROM_STORE):
                self.upward.append(f"{caller}.{frame.f_back.f_code.co_name} -> {module}.{name}")  # type: ignore[union-attr]
            self.events.append(("pikku", module, name))
        elif name == BODY:
            self.events.append(("body", module, name))
        elif module == "sqlalchemy.engine.base" and name == "_execute_context":
            self.events.append(("sql", module, name))
        elif module == "kombu.messaging" and name == "_publish":
            self.events.append(("publish", module, name))
        elif module == "celery.app.trace" and name == "trace_task":
            self.events.append(("task", module, name))


def build(database: str) -> tuple[Celery, Pikku, Any, Any]:
    app = Celery("path", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_default_queue="pikku-path", broker_connection_retry_on_startup=True)
    pikku = Pikku(app, database, install_beat=False)

    @app.task(name="path.inc", shared=False)
    def path_inc(x: int) -> int:
        return x + 1

    @pikku.workflow(name="path.eager")
    def eager(ctx: Context, n: int) -> Any:
        x = 0
        for i in range(n):
            x = ctx.step(f"s{i}", path_inc, x)
        return x

    @pikku.workflow(name="path.broker", eager_steps=False)
    def broker(ctx: Context, n: int) -> Any:
        x = 0
        for i in range(n):
            x = ctx.step(f"s{i}", path_inc, x)
        return x

    return app, pikku, eager, broker


def cut(events: list[tuple[str, str, str]], eager: bool) -> list[tuple[str, str, str]]:
    """The third step's part of the record (see the module's docstring)."""
    bodies = [i for i, e in enumerate(events) if e[0] == "body"]
    if eager:
        return events[bodies[2] + 1 : bodies[3]]
    tasks = [i for i, e in enumerate(events) if e[0] == "task"]
    start = max(i for i in tasks if i < bodies[2])
    end = min((i for i in tasks if i > bodies[2]), default=len(events))
    return events[start:end]


def describe(part: list[tuple[str, str, str]]) -> dict[str, Any]:
    order: list[str] = []
    path: list[str] = []
    for kind, module, _ in part:
        label = module.removeprefix("pikku_celery.") if kind == "pikku" else f"[{kind}]"
        if kind == "pikku" and label not in order:
            order.append(label)
        if not path or path[-1] != label:
            path.append(label)
    return {
        "modules": order,
        "hops": len(path) - 1,
        "calls": sum(1 for e in part if e[0] == "pikku"),
        "sql": sum(1 for e in part if e[0] == "sql"),
        "publish": sum(1 for e in part if e[0] == "publish"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database", default=None, help="a SQLAlchemy URL (default: an SQLite file)"
    )
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="pikku-path-")
    database = args.database or f"sqlite:///{os.path.join(workdir, 'path.db')}"
    app, pikku, eager, broker = build(database)
    record = Record()
    threading.setprofile(record.hook)
    results: dict[str, dict[str, Any]] = {}
    with start_worker(app, pool="solo", perform_ping_check=False, loglevel="WARNING") as worker:
        try:
            for label, flow, is_eager in (("eager", eager, True), ("broker", broker, False)):
                assert flow.start(4).wait(timeout=60) == 4  # warm: imports, statements, pools
                record.events.clear()
                record.upward.clear()
                record.on = True
                try:
                    assert flow.start(4).wait(timeout=60) == 4
                finally:
                    record.on = False
                results[label] = describe(cut(record.events, is_eager))
                results[label]["upward"] = sorted(set(record.upward))
        finally:
            app.control.shutdown(destination=[worker.hostname])
            threading.setprofile(None)
    pikku.close()
    for label, found in results.items():
        print(
            f"\n{label} step: {len(found['modules'])} pikku modules crossed, "
            f"{found['hops']} hops between modules, {found['calls']} pikku calls, "
            f"{found['sql']} SQL statements, {found['publish']} publishes"
        )
        print("  " + " → ".join(found["modules"]))
        print(f"  calls from the store up into the engine or Celery: {len(found['upward'])}")
        for call in found["upward"]:
            print(f"    {call}")


if __name__ == "__main__":
    main()
