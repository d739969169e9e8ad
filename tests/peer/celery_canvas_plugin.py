"""A pytest plugin for Celery's own ``t/integration/test_canvas.py``.

Loaded by :mod:`tests.peer.run_celery_canvas` into a pytest run inside an
unpacked Celery source tree. It attaches ``Pikku`` to Celery's session app
before the session worker starts and, with ``PIKKU_PEER_MODE=durable``,
routes every canvas the test itself starts (``chain``/``group``/``chord``
``apply_async``, ``delay``, calling it) through ``pikku.durable()``. Each
test's outcome and what happened to its canvases is written to
``PIKKU_PEER_OUT`` (JSON lines).
"""

from __future__ import annotations

import json
import os
import threading
import types
from typing import Any

import pytest
import sqlalchemy as sa
from celery import current_task
from celery.app.task import Task
from celery.canvas import Signature, _chain, _chord, chord, group
from celery.contrib.testing import worker as testing_worker

MODE = os.environ.get("PIKKU_PEER_MODE", "plain")
OUT = os.environ.get("PIKKU_PEER_OUT", "peer-results.jsonl")
DATABASE = os.environ["PIKKU_PEER_DATABASE"]
TIMEOUT = float(os.environ.get("PIKKU_PEER_TIMEOUT", "20"))
PARENT = os.getpid()

_state: dict[str, Any] = {"pikku": None, "test": None}


def _attach(app: Any) -> Any:
    from pikku_celery import Pikku
    from pikku_celery.sql.schema import metadata

    if _state["pikku"] is None:
        engine = sa.create_engine(DATABASE)
        metadata.create_all(engine)
        engine.dispose()
        # Celery's suite has 1,000-member headers: the step limit is a setting.
        _state["pikku"] = Pikku(
            app, database_url=DATABASE, sweep_interval=1.0, max_steps_per_run=5_000
        )
    return _state["pikku"]


_start_worker = testing_worker.start_worker


def _start_worker_with_pikku(app: Any, *args: Any, **kwargs: Any) -> Any:
    _attach(app)
    return _start_worker(app, *args, **kwargs)


testing_worker.start_worker = _start_worker_with_pikku  # type: ignore[assignment]


def _top_level() -> bool:
    """A canvas the test itself starts (not one a task builds inside the worker)."""
    return (
        os.getpid() == PARENT
        and threading.current_thread() is threading.main_thread()
        and current_task is not None
        and current_task._get_current_object() is None
    )


def _with_call(sig: Signature, args: Any, kwargs: Any, options: dict[str, Any]) -> Signature:
    """``sig`` as ``sig.apply_async(args, kwargs, **options)`` would run it."""
    sig = sig.clone()
    args, kwargs = tuple(args or ()), dict(kwargs or {})
    if args or kwargs:
        if sig.subtask_type is None:
            sig = sig.clone(args, kwargs)
        elif isinstance(sig, _chain):
            sig = _chain(*_fed(list(sig.tasks), args, kwargs), **sig.options)
        elif isinstance(sig, _chord):
            body = kwargs.pop("body", None) or sig.body  # chord(header)(body)
            header = group([t.clone(args, kwargs) for t in sig.tasks])
            sig = chord(header, body, **sig.options)
        elif isinstance(sig, group):
            sig = group([t.clone(args, kwargs) for t in sig.tasks], **sig.options)
    for key, value in options.items():
        if key in ("link", "link_error"):
            for callback in value if isinstance(value, (list, tuple)) else [value]:
                (sig.link if key == "link" else sig.link_error)(callback)
        else:
            sig.options[key] = value
    return sig


_inside = threading.local()

TREE = ("parent", "children", "results", "as_tuple", "collect", "graph", "iterdeps")
"""``AsyncResult``'s result tree: a durable canvas is one result (documented)."""


def _watched(result: Any, test: dict[str, Any]) -> Any:
    """``result``, noting in ``test`` when the test reads the result tree."""
    from pikku_celery import DurableResult

    class Watched(DurableResult):
        def __getattribute__(self, name: str) -> Any:
            if name in TREE:
                test["tree"] = True
            return super().__getattribute__(name)

    return Watched(result.run, result.id)


def _fed(tasks: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """A chain's tasks with ``args``/``kwargs`` given to its first real task
    (past empty groups and chains, as Celery passes them)."""
    for i, task in enumerate(tasks):
        if isinstance(task, group) and not task.tasks:
            continue
        if isinstance(task, (group, _chord)):
            return [*tasks[:i], _with_call(task, args, kwargs, {}), *tasks[i + 1 :]]
        if isinstance(task, _chain):
            if not task.tasks:
                continue
            inner = _chain(*_fed(list(task.tasks), args, kwargs), **task.options)
            return [*tasks[:i], inner, *tasks[i + 1 :]]
        return [*tasks[:i], task.clone(args, kwargs), *tasks[i + 1 :]]
    return tasks


def _lazy_header(sig: Any) -> bool:
    """Whether a chord in ``sig`` takes its header from a generator not yet
    consumed (Celery's lazy list keeps it)."""
    if not isinstance(sig, Signature) or sig.subtask_type is None:
        return False
    tasks = sig.tasks
    lazy = isinstance(getattr(tasks, "_regen__it", None), types.GeneratorType)
    if lazy and isinstance(sig, _chord):
        return True  # chord(generator, body): Celery sends members as they come
    if lazy:
        return False  # a group's generator: consumed when it is applied, as here
    inner = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
    if isinstance(sig, _chord):
        inner.append(sig.body)
    return any(_lazy_header(t) for t in inner)


def _routed(cls: Any, as_signature: Any) -> None:
    """Route ``cls.apply_async`` of a canvas the test starts through ``durable()``."""
    plain = cls.apply_async

    def apply_async(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        test = _state["test"]
        if (
            MODE != "durable"
            or test is None
            or getattr(_inside, "busy", False)
            or self.app.conf.task_always_eager  # Celery sends nothing: it runs in place
            or not _top_level()
            or (isinstance(self, Task) and str(self.name or "").startswith(("pikku", "celery.")))
        ):
            return plain(self, args, kwargs, **options)
        _inside.busy = True
        try:
            test["canvases"] += 1
            from pikku_celery.errors import PikkuError

            pikku = _state["pikku"]
            if _lazy_header(self):
                # Celery sends a generator header's members as it yields them;
                # a stored plan takes the whole header when the canvas starts.
                test["lazy"] = True
            try:
                sig = _with_call(as_signature(self), args, kwargs, options)
                run = pikku.durable(sig)
            except PikkuError as refused:
                test["refused"].append(f"{type(refused).__name__}: {refused}"[:300])
                return plain(self, args, kwargs, **options)
            test["durable"] += 1
            return _watched(run.async_result(), test)
        finally:
            _inside.busy = False

    cls.apply_async = apply_async


for _cls in (_chain, group, _chord):
    _routed(_cls, lambda sig: sig)
# A single task the test sends (``add.delay()``, ``add.s().apply_async()``) is
# a one-node canvas: its body may replace itself, add to a chord, fail.
_routed(Task, lambda task: task.signature())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Shorter waits than Celery's 60 s: a canvas that does not settle fails sooner."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "TIMEOUT", None) == 60:
            module.TIMEOUT = TIMEOUT


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _state["test"] = {
        "id": item.nodeid,
        "canvases": 0,
        "durable": 0,
        "refused": [],
        "tree": False,
        "lazy": False,
        "outcome": "passed",
        "error": "",
    }


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test = _state["test"]
    if test is None or test["id"] != report.nodeid:
        return
    if report.skipped and test["outcome"] == "passed":
        test["outcome"] = "xfailed" if hasattr(report, "wasxfail") else "skipped"
    elif report.failed:
        test["outcome"] = "failed" if report.when == "call" else f"error-{report.when}"
        if not test["error"]:
            test["error"] = str(report.longrepr).strip().splitlines()[-1][:300]
    if report.when == "teardown":
        with open(OUT, "a", encoding="utf-8") as out:
            out.write(json.dumps(test) + "\n")
        _state["test"] = None
