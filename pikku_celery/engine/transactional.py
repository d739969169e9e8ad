"""Transactional steps: the task's own writes commit with its fenced outcome.

When a step's task writes to tables in the store's database, its body can run
inside the transaction that records the step's outcome. A superseded attempt
is refused at that write and its work rolls back with it; a worker killed
before commit leaves nothing behind. Exactly once, for writes to that database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ..errors import PikkuError

T = TypeVar("T")

MARK = "pikku_transactional"

_connection: ContextVar[Any | None] = ContextVar("pikku_step_connection", default=None)


def transactional(task: T) -> T:
    """Mark a task (a Celery task or a plain function) as transactional.

    Put it above ``@app.task``; inside the body, :func:`step_connection`
    is the open SQLAlchemy connection of the step's transaction.
    """
    setattr(task, MARK, True)
    return task


def is_transactional(target: Any) -> bool:
    """Whether ``target`` was marked with :func:`transactional`."""
    return bool(getattr(target, MARK, False))


def step_connection() -> Any:
    """The SQLAlchemy connection of the running transactional step."""
    conn = _connection.get()
    if conn is None:
        raise PikkuError(
            "step_connection() is only available inside a task marked "
            "@pikku_celery.transactional while it runs as a workflow step"
        )
    return conn


@contextmanager
def bound_connection(conn: Any) -> Iterator[None]:
    """Make ``conn`` what :func:`step_connection` returns inside the block."""
    token = _connection.set(conn)
    try:
        yield
    finally:
        _connection.reset(token)


def run_with_connection(conn: Any, fn: Callable[[], T]) -> T:
    """Call ``fn`` with ``conn`` bound as the step's connection."""
    with bound_connection(conn):
        return fn()
