"""A connector with no database: it records each statement by name, for tests.

A test builds a service on :class:`RecordingConnector`, scripts the rows each
statement name answers, and checks what the service ran (names and
parameters, and which ran inside one transaction) without reaching into the
service or opening a connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa

from .connector import Connector, Params, Registry, Transaction
from .dialect import Dialect

T = TypeVar("T")
Answer = Sequence[Any] | Callable[[Params], Sequence[Any]]
"""The rows a statement answers: a list, or a function of its parameters."""


@dataclass(frozen=True)
class Call:
    """One statement run: its name, its parameters and the transaction it ran in
    (0 on its own, else the 1-based count of transactions opened so far)."""

    name: str
    params: dict[str, Any]
    transaction: int = 0


@dataclass
class RecordingConnector(Connector):
    """Runs nothing; records every call and answers from ``answers``.

    A name with no answer returns no rows (and a write, zero matched); a name
    that is not registered raises ``KeyError``, as the real connectors do, so
    a typo in a service fails here too. ``fail`` makes the named statements
    raise the given exception once each, e.g. a transient error to retry.
    """

    dialect: Dialect
    answers: dict[str, Answer] = field(default_factory=dict)
    fail: dict[str, BaseException] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    registry: Registry = field(default_factory=Registry)
    created: list[str] = field(default_factory=list)
    """Names of the tables :meth:`create_tables` was asked for."""
    _transactions: int = 0
    _open: int = 0

    def names(self) -> list[str]:
        """The names of the statements run, in order."""
        return [c.name for c in self.calls]

    def _answer(self, name: str, params: Params) -> Sequence[Any]:
        self.registry[name]  # an unknown name fails as in a real connector
        self.calls.append(Call(name, dict(params), self._open))
        failure = self.fail.pop(name, None)
        if failure is not None:
            raise failure
        answer = self.answers.get(name, ())
        return list(answer(params) if callable(answer) else answer)

    def _single(self, name: str, params: Params) -> Sequence[Any]:
        return self._answer(name, params)

    def run(self, name: str, params: Params) -> int:
        """Record a write; its answer's length is the rows it matched."""
        return self._retried(lambda: len(self._answer(name, params)))

    def transaction(self, work: Callable[[Transaction], T]) -> T:
        """Record ``work``'s calls as one transaction (a new one per retry)."""

        def once() -> T:
            self._transactions += 1
            self._open = self._transactions
            try:
                return work(_Recorded(self))
            finally:
                self._open = 0

        return self._retried(once)

    def create_tables(self, tables: Sequence[sa.Table]) -> None:
        """Record the tables' names."""
        self.created.extend(t.name for t in tables)


class _Recorded:
    """:class:`Transaction` of a :class:`RecordingConnector`."""

    def __init__(self, owner: RecordingConnector) -> None:
        self.owner = owner

    def one(self, name: str, params: Params) -> Any | None:
        rows = self.owner._answer(name, params)
        return rows[0] if rows else None

    def all(self, name: str, params: Params) -> Sequence[Any]:
        return self.owner._answer(name, params)

    def run(self, name: str, params: Params) -> int:
        return len(self.owner._answer(name, params))


def recording(dialect: Dialect, answers: Mapping[str, Answer] | None = None) -> RecordingConnector:
    """A :class:`RecordingConnector` for ``dialect`` answering ``answers``."""
    return RecordingConnector(dialect, dict(answers or {}))
