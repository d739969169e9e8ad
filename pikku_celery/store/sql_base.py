"""What every part of the SQL store shares: its engine, statements, runner and first use."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Concatenate, ParamSpec, TypeVar

import sqlalchemy as sa

from ..sql.pooler import Pooler
from ..sql.runner import Runner
from .statements import Statements

_Self = TypeVar("_Self", bound="SQLBase")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _prepared(
    method: Callable[Concatenate[_Self, _P], _R],
) -> Callable[Concatenate[_Self, _P], _R]:
    """The store's first use, by any method, checks the schema (``prepare``)."""

    def call(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not self._ready:
            self.prepare()
        return method(self, *args, **kwargs)

    functools.update_wrapper(call, method)
    return call


class SQLBase:
    """The SQL store's state, as each of its parts (a class per concept) uses it."""

    _engine: sa.Engine
    _single: sa.Engine
    _ready: bool
    statements: Statements
    runner: Runner
    durable_claims: bool
    pooler: Pooler | None

    def prepare(self) -> None:
        """Check the schema and learn the connection, once (the store's)."""
        raise NotImplementedError

    @contextmanager
    def _one(self) -> Iterator[sa.Connection]:
        """A connection for one statement: a short transaction (autocommit
        where the dialect's store says so)."""
        with self._single.begin() as conn:
            yield conn
