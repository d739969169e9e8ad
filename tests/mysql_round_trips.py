"""Round trips to MySQL/MariaDB over PyMySQL, counted on the client.

Each ``Cursor.execute`` (a multi-statement batch is one), ``commit`` and
``rollback`` is one round trip; these are PyMySQL's public methods, wrapped
while counting. For the tests that pin what a store call costs on MariaDB,
and the workflow benchmark's worker (``benchmarks/benchapp.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pymysql

_SENDERS: tuple[tuple[type, str], ...] = (
    (pymysql.cursors.Cursor, "execute"),
    (pymysql.connections.Connection, "commit"),
    (pymysql.connections.Connection, "rollback"),
)


@contextmanager
def counting() -> Iterator[list[int]]:
    """While open, ``sent[0]`` counts this process's round trips to MySQL."""
    sent = [0]
    originals = [(owner, name, getattr(owner, name)) for owner, name in _SENDERS]

    def counted(call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            sent[0] += 1
            return call(*args, **kwargs)

        return wrapper

    for owner, name, call in originals:
        setattr(owner, name, counted(call))
    try:
        yield sent
    finally:
        for owner, name, call in originals:
            setattr(owner, name, call)
