"""The narrow connector: statements run by name, whichever path runs them.

A service registers its statements once (:class:`Registry`: name →
statement, each built for the engine's :class:`~.dialect.Dialect`) and then
only says *which* statement to run and with what: ``one`` / ``all`` / ``run``
on their own, several in one ``transaction`` or one ``batch``. Behind the
interface sit plain SQLAlchemy (:class:`SQLAlchemyConnector`) and libpq's
prepared statements (:class:`LibpqConnector`); tests put
:class:`~.recording.RecordingConnector` in their place. Errors are
SQLAlchemy's whichever path ran.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, cast

import sqlalchemy as sa

from ..retry import ROLLED_BACK
from .dialect import Dialect, create
from .engines import READ_ONLY_OPTION
from .runner import LibpqRunner, SQLAlchemyRunner

T = TypeVar("T")
Params = Mapping[str, Any]


class Registry:
    """Statements by name: the one place a service's SQL is found.

    A name is bound once; binding it again to another statement is a mistake
    (two services disagreeing about what a name means), refused at once.
    """

    def __init__(self, statements: Mapping[str, sa.Executable] | None = None) -> None:
        self._statements: dict[str, sa.Executable] = {}
        if statements:
            self.add(statements)

    def add(self, statements: Mapping[str, sa.Executable]) -> None:
        """Bind each name to its statement."""
        for name, statement in statements.items():
            known = self._statements.get(name)
            if known is not None and known is not statement:
                raise ValueError(f"statement {name!r} is already registered")
            self._statements[name] = statement

    def __getitem__(self, name: str) -> sa.Executable:
        try:
            return self._statements[name]
        except KeyError:
            raise KeyError(f"no statement named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._statements

    def items(self) -> list[tuple[str, sa.Executable]]:
        """Every (name, statement), in the order registered."""
        return list(self._statements.items())


class Transaction(Protocol):
    """Statements run by name inside one open transaction."""

    def one(self, name: str, params: Params) -> Any | None:
        """The statement's first row, or None."""
        ...

    def all(self, name: str, params: Params) -> Sequence[Any]:
        """Every row of the statement."""
        ...

    def run(self, name: str, params: Params) -> int:
        """Run a write; the number of rows it matched."""
        ...


class Connector(abc.ABC):
    """Runs registered statements by name (see the module docstring).

    ``one`` / ``all`` / ``run`` each run in a transaction of their own
    (autocommit where the dialect says a lone statement needs none);
    ``transaction`` and ``batch`` run several in one. Whatever the database
    rolled back to let another through (:attr:`Dialect.transient`) is run
    again, as a whole, by :data:`~pikku_celery.retry.ROLLED_BACK`.
    """

    def __init__(self, dialect: Dialect, registry: Registry | None = None) -> None:
        self.dialect = dialect
        self.registry = registry if registry is not None else Registry()

    def register(self, statements: Mapping[str, sa.Executable]) -> None:
        """Add named statements (see :meth:`Registry.add`)."""
        self.registry.add(statements)

    def _retried(self, call: Callable[[], T]) -> T:
        return ROLLED_BACK.call(call, self.dialect.transient)

    def one(self, name: str, params: Params) -> Any | None:
        """The statement's first row, or None, in a transaction of its own."""
        rows = self._retried(lambda: self._single(name, params))
        return rows[0] if rows else None

    def all(self, name: str, params: Params) -> Sequence[Any]:
        """Every row of the statement, in a transaction of its own."""
        return self._retried(lambda: self._single(name, params))

    @abc.abstractmethod
    def run(self, name: str, params: Params) -> int:
        """Run a write in a transaction of its own; the rows it matched."""

    @abc.abstractmethod
    def _single(self, name: str, params: Params) -> Sequence[Any]:
        """One statement's rows, in a transaction of its own (not retried)."""

    @abc.abstractmethod
    def transaction(self, work: Callable[[Transaction], T]) -> T:
        """``work(tx)`` inside one transaction, committed when it returns;
        called again from the start if the database rolled it back."""

    def batch(
        self, names: Sequence[str], params: Params, *, answer: int | None = -1
    ) -> Sequence[Any]:
        """The named statements in order, in one transaction, with the same
        parameters: the rows of the one at index ``answer`` (None: the first
        one's matched count, as one row).

        A connector that can sends them in one round trip (MySQL's
        multi-statement batches: :class:`MySQLBatchConnector`); this one runs
        them in turn. The parameters are shared: name them apart from the
        columns the statements write (SQLAlchemy adds a parameter named
        after a column to an ``UPDATE``'s ``SET``).
        """

        def work(tx: Transaction) -> Sequence[Any]:
            if answer is None:
                first = tx.run(names[0], params)
                for name in names[1:]:
                    tx.all(name, params)
                return [(first,)]
            out = [tx.all(name, params) for name in names]
            return out[answer]

        return self.transaction(work)

    @abc.abstractmethod
    def create_tables(self, tables: Sequence[sa.Table]) -> None:
        """Create ``tables`` if missing (tests and SQLite; servers migrate)."""

    def close(self) -> None:  # noqa: B027 (nothing to give back unless a subclass opened it)
        """Give back what the connector opened (a connection you gave stays yours)."""


class _Open:
    """:class:`Transaction` over an open SQLAlchemy connection."""

    def __init__(self, conn: sa.Connection, registry: Registry) -> None:
        self.conn = conn
        self.registry = registry

    def one(self, name: str, params: Params) -> Any | None:
        return self.conn.execute(self.registry[name], params).first()

    def all(self, name: str, params: Params) -> Sequence[Any]:
        result = self.conn.execute(self.registry[name], params)
        return result.all() if result.returns_rows else []

    def run(self, name: str, params: Params) -> int:
        result = self.conn.execute(self.registry[name], params)
        return len(result.all()) if result.returns_rows else int(result.rowcount)


class SQLAlchemyConnector(Connector):
    """Through SQLAlchemy's ordinary path, on every dialect.

    ``bind`` is an Engine (each call checks out a connection) or one
    Connection kept for this connector, e.g. one per worker thread, which
    saves the pool checkout; calls on it are serialised, so a renewer thread
    may share it.
    """

    def __init__(
        self,
        bind: sa.Engine | sa.Connection,
        dialect: Dialect | None = None,
        registry: Registry | None = None,
    ) -> None:
        super().__init__(dialect if dialect is not None else create(bind), registry)
        self.lock = threading.Lock()
        """Serialises calls on a bound connection."""
        autocommit = self.dialect.autocommit_single
        if isinstance(bind, sa.Connection):
            self.connection: sa.Connection | None = bind
            self.engine = bind.engine
            if autocommit:
                bind.execution_options(isolation_level="AUTOCOMMIT")
            self._alone = self.engine
            self._reader = self.engine
        else:
            self.connection = None
            self.engine = bind
            self._alone = (
                bind.execution_options(isolation_level="AUTOCOMMIT") if autocommit else bind
            )
            self._reader = bind.execution_options(**{READ_ONLY_OPTION: True})

    @contextmanager
    def begin(self, alone: bool = False, reads: bool = False) -> Iterator[sa.Connection]:
        """A connection in a transaction, committed on exit.

        ``alone``: it runs one statement (autocommit where the dialect has
        it); ``reads``: it only reads (no write lock on SQLite).
        """
        conn = self.connection
        if conn is not None:
            with self.lock:
                if self.dialect.autocommit_single and conn.invalidated:
                    # Reconnect now (SQLAlchemy would on next use) and put the
                    # new DBAPI connection in autocommit too.
                    conn.execution_options(isolation_level="AUTOCOMMIT")
                with conn.begin():
                    yield conn
            return
        engine = self._alone if alone else self._reader if reads else self.engine
        with engine.begin() as opened:
            yield opened

    def _single(self, name: str, params: Params) -> Sequence[Any]:
        statement = self.registry[name]
        with self.begin(alone=True, reads=isinstance(statement, sa.Select)) as conn:
            result = conn.execute(statement, params)
            return result.all() if result.returns_rows else []

    def run(self, name: str, params: Params) -> int:
        """Run a write in a transaction of its own; the rows it matched."""

        def once() -> int:
            with self.begin(alone=True) as conn:
                return _Open(conn, self.registry).run(name, params)

        return self._retried(once)

    def transaction(self, work: Callable[[Transaction], T]) -> T:
        """``work(tx)`` in one transaction (again if the database rolled it back)."""

        def once() -> T:
            with self.begin() as conn:
                return work(_Open(conn, self.registry))

        return self._retried(once)

    def create_tables(self, tables: Sequence[sa.Table]) -> None:
        """Create ``tables`` if missing."""
        with self.begin() as conn:
            for table in tables:
                table.create(conn, checkfirst=True)

    def close(self) -> None:
        """Close the engine's pooled connections; a connection you gave is yours to close."""
        if self.connection is None:
            self.engine.dispose(close=True)


class LibpqConnector(SQLAlchemyConnector):
    """PostgreSQL over psycopg: a statement on its own runs as a prepared
    statement straight on libpq (:class:`~.runner.LibpqRunner`), named
    ``prefix`` + a hash of its SQL; what that path cannot take goes the
    ordinary way. Transactions go the ordinary way."""

    def __init__(
        self,
        bind: sa.Engine | sa.Connection,
        dialect: Dialect | None = None,
        registry: Registry | None = None,
        *,
        prefix: str = "pikku_",
    ) -> None:
        super().__init__(bind, dialect, registry)
        fallback = SQLAlchemyRunner(lambda: self.begin(alone=True))
        self.runner = LibpqRunner(
            self.engine, fallback, prefix=prefix, connection=self.connection, lock=self.lock
        )

    def _single(self, name: str, params: Params) -> Sequence[Any]:
        return self.runner.rows(self.registry[name], params)

    def run(self, name: str, params: Params) -> int:
        """Run a write on its own; the rows it matched (on libpq when the
        statement returns them, which is how libpq's path counts)."""
        statement = self.registry[name]
        if isinstance(statement, sa.sql.expression.ReturnsRows) and statement.exported_columns:
            return len(self._retried(lambda: self.runner.rows(statement, params)))
        return super().run(name, params)


class MySQLBatchConnector(SQLAlchemyConnector):
    """MySQL/MariaDB over PyMySQL: a :meth:`batch` goes as one round trip,
    its statements and COMMIT joined (:mod:`~.mysql_batch`), on connections
    that take several statements per call (engines from
    :func:`~.engines.make_engine`); elsewhere, statement by statement."""

    def __init__(
        self,
        bind: sa.Engine | sa.Connection,
        dialect: Dialect | None = None,
        registry: Registry | None = None,
    ) -> None:
        super().__init__(bind, dialect, registry)
        self._batches: dict[tuple[tuple[str, ...], int | None], Any] = {}
        self._takes: bool | None = None

    def batch(
        self, names: Sequence[str], params: Params, *, answer: int | None = -1
    ) -> Sequence[Any]:
        """As :meth:`Connector.batch`, in one round trip where the connection allows."""
        # Imported here: PyMySQL is loaded only where batches run.
        from .mysql_batch import Batch, NamedRow, run_batch, takes_batches

        found = self._batches.get((tuple(names), answer))
        if found is None:
            statements: list[sa.ClauseElement | str] = [
                cast(sa.ClauseElement, self.registry[name]) for name in names
            ]
            # The answer's index within the batch, whose last statement is the COMMIT.
            rows_of = None if answer is None else range(len(names))[answer]
            found = Batch(self.engine.dialect, [*statements, "COMMIT"], rows_of=rows_of)
            self._batches[(tuple(names), answer)] = found
        batch = found

        def once() -> Sequence[Any] | None:
            with self._checked_out() as conn:
                if self._takes is None:
                    self._takes = takes_batches(conn)
                if not self._takes:
                    return None
                results = run_batch(conn, batch, params)
            if batch.rows_of is None:
                return [(results[0][0],)]
            _, rows, columns = results[batch.rows_of]
            return [NamedRow(columns or [], row) for row in rows or []]

        done = self._retried(once)
        return super().batch(names, params, answer=answer) if done is None else done

    @contextmanager
    def _checked_out(self) -> Iterator[sa.Connection]:
        """A connection outside any transaction: the batch brings its own COMMIT."""
        if self.connection is not None:
            with self.lock:
                yield self.connection
        else:
            with self.engine.connect() as conn:
                yield conn


def connect(
    bind: sa.Engine | sa.Connection, registry: Registry | None = None, *, prefix: str = "pikku_"
) -> SQLAlchemyConnector:
    """The connector for ``bind``: libpq's prepared statements or MySQL's
    batches where the dialect allows, else plain SQLAlchemy."""
    dialect = create(bind)
    if dialect.prepared and dialect.autocommit_single:
        return LibpqConnector(bind, dialect, registry, prefix=prefix)
    if dialect.batches:
        return MySQLBatchConnector(bind, dialect, registry)
    return SQLAlchemyConnector(bind, dialect, registry)
