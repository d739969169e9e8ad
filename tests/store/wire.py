"""What crosses the wire to PostgreSQL: the libpq trace of a store's one
connection, for tests that pin how many round trips (and rows) a call costs.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa

from pikku_celery.store import Decision, StepOutcome, StepState
from pikku_celery.store.sql import SQLWorkflowStore
from tests.store.support import claim, make_tasks, task, threaded

T = TypeVar("T")


def on_wire(engine: sa.Engine, fn: Callable[[], T]) -> tuple[T, list[str]]:
    """``fn()``, and the libpq trace of the engine's one connection meanwhile."""
    with engine.connect() as conn:
        pgconn = conn.connection.dbapi_connection.pgconn  # type: ignore[union-attr]
    fd, path = tempfile.mkstemp()
    try:
        pgconn.trace(fd)
        try:
            value = fn()
        finally:
            pgconn.untrace()
        with open(path) as f:
            return value, f.read().splitlines()
    finally:
        os.close(fd)
        os.unlink(path)


def round_trips(lines: list[str]) -> int:
    """The client's Query/Sync messages: one per round trip."""
    return sum(1 for line in lines if "\tF\t" in line and ("\tQuery\t" in line or "\tSync" in line))


def _sent_rows(lines: list[str]) -> list[list[str]]:
    return [line.split("\t") for line in lines if "\tB\t" in line and "\tDataRow\t" in line]


def data_rows(lines: list[str]) -> int:
    """The rows the server sent."""
    return len(_sent_rows(lines))


def longest_row(lines: list[str]) -> int:
    """The length of the biggest row the server sent (the trace's third field)."""
    return max(int(fields[2]) for fields in _sent_rows(lines))


def warm_up(store: SQLWorkflowStore) -> None:
    """Prepare the fast path's statements on the connection (a statement's
    first run on a connection costs one more round trip): a new run's first
    pass, a claim, and passes with an outcome, with and without a new step."""
    run, [first] = make_tasks(store, 1)
    got = claim(store, first, "warm")
    passes = threaded(store)
    passes.take_pass(run.id, ok(got), lambda view: Decision(new_steps=[task("next", 1)]))
    nxt = store.get_steps(run.id)[1]
    passes.take_pass(run.id, ok(claim(store, nxt, "warm")), lambda view: Decision())


def ok(step: StepState, result: Any = None) -> StepOutcome:
    return StepOutcome(step.id, step.attempt, ok=True, result=result)
