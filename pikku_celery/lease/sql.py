"""Leases in one SQL table, judged on the database's clock: the portable service.

Every statement is built once per service (SQLAlchemy Core, cached compiled
forms) so that the common operations are one round trip where the database
allows:

=============  ==============================================  ======================
operation      PostgreSQL / SQLite >= 3.35 / MariaDB >= 10.5   MySQL (no RETURNING)
=============  ==============================================  ======================
acquire        one upsert ``... RETURNING``                     upsert, read back
refresh        ``UPDATE ... RETURNING`` (MariaDB: read back)    ``UPDATE``, read back
release        one guarded ``UPDATE``                           same
get            one ``SELECT``                                   same
=============  ==============================================  ======================

"Read back" means a ``SELECT`` of the row in the same transaction: MySQL has no
``RETURNING`` and its affected-row count counts *changed* rows (or matched
rows, depending on a client flag), so the row itself says who won.

``SQLLeaseService(engine)`` builds the service for the engine's dialect:
this class is SQLite's as it is; :mod:`.sql_postgres` and :mod:`.sql_mysql`
override only what their database does differently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from ..sql.engines import now_ms_expr
from ..store.schema import lease_table
from .base import TTL, Lease, ttl_millis

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_T = TypeVar("_T")


def _to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class SQLLeaseService:
    """Leases in table ``pikku_lease`` (SQLite, PostgreSQL, MySQL/MariaDB).

    One row per key: ``holder``, fencing ``token`` and ``expires_at`` in epoch
    milliseconds on the database clock (PostgreSQL ``clock_timestamp()``,
    MySQL/MariaDB ``UTC_TIMESTAMP(6)``, SQLite the host clock). Release sets
    ``expires_at`` to 0 but keeps the row, so the next holder's token is
    still one higher than the last.

    ``engine`` is an Engine (each operation checks out a connection) or one
    Connection the service keeps for itself, e.g. one per worker thread: that
    saves the pool checkout per operation. Calls on a bound connection are
    serialised (``hold_lease``'s renewer thread shares it safely).

    ``use_returning``: None picks ``RETURNING`` where the server has it; False
    forces the portable upsert-then-read-back path (tests use it to cover the
    MySQL path on MariaDB).
    """

    autocommit: ClassVar[bool] = False
    """Whether single statements run in autocommit (no BEGIN/COMMIT round trips)."""

    def __new__(cls, engine: sa.Engine | sa.Connection, *_: Any, **__: Any) -> SQLLeaseService:
        """The service for ``engine``'s dialect (see :func:`lease_class_for`)."""
        chosen = lease_class_for(engine.dialect.name) if cls is SQLLeaseService else cls
        return super().__new__(chosen)

    def __init__(
        self,
        engine: sa.Engine | sa.Connection,
        table: str = lease_table.name,
        *,
        use_returning: bool | None = None,
    ) -> None:
        bind = engine
        self._dialect = bind.dialect.name
        self._table = (
            lease_table
            if table == lease_table.name
            else lease_table.to_metadata(sa.MetaData(), name=table)
        )
        self._use_returning = use_returning
        self._conn: sa.Connection | None = None
        self._lock = threading.Lock()
        if isinstance(bind, sa.Connection):
            self._conn = bind
            if self.autocommit:
                bind.execution_options(isolation_level="AUTOCOMMIT")
            self._engine = bind.engine
            self._single = bind.engine
        else:
            self._engine = bind
            self._single = (
                bind.execution_options(isolation_level="AUTOCOMMIT") if self.autocommit else bind
            )
        # Single statements in autocommit need no transaction of their own.
        self._single_statement = self.autocommit and use_returning is not False
        self._build_statements()
        self._setup()

    def _setup(self) -> None:
        """The dialect's own state, once the service is built."""

    # -- statements, built once ------------------------------------------------

    def _upsert(self, values: dict[str, Any], ttl: Any, one: Any) -> tuple[Any, Any]:
        """The acquire's upsert and its RETURNING form: ``INSERT ... ON
        CONFLICT DO UPDATE`` (SQLite's and PostgreSQL's)."""
        t = self._table
        ins = self._insert(t).values(values)
        new = ins.excluded
        # The clock is read once, in VALUES: "now" is the proposed expiry
        # minus the ttl. (clock_timestamp() moves between calls.)
        lapsed = t.c.expires_at <= new.expires_at - ttl
        upsert = ins.on_conflict_do_update(
            index_elements=[t.c.key],
            set_={
                # Same live holder keeps its token; a change of hands
                # (lapse or release) bumps it.
                "token": sa.case((lapsed, t.c.token + one), else_=t.c.token),
                "holder": new.holder,
                "expires_at": new.expires_at,
            },
            where=sa.or_(lapsed, t.c.holder == new.holder),
        )
        return upsert, upsert.returning(t.c.holder, t.c.token, t.c.expires_at)

    def _insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def _refresh_returns(self) -> bool:
        """Whether the refresh has a RETURNING form (MySQL has none)."""
        return True

    def _release_statement(self, release: sa.Update) -> sa.Update:
        return release

    def _build_statements(self) -> None:
        t = self._table
        now = now_ms_expr(self._dialect)
        key = sa.bindparam("lease_key", type_=t.c.key.type)
        holder = sa.bindparam("lease_holder", type_=t.c.holder.type)
        token = sa.bindparam("lease_token", type_=sa.BigInteger())
        ttl = sa.bindparam("ttl_ms", type_=sa.BigInteger())
        one = sa.literal_column("1", sa.BigInteger())
        values = {"key": key, "holder": holder, "token": one, "expires_at": now + ttl}
        self._now, self._key, self._holder, self._ttl, self._one = now, key, holder, ttl, one
        upsert, returning = self._upsert(values, ttl, one)
        self._acquire_upsert: sa.Executable = upsert
        self._acquire_returning: sa.Executable | None = returning

        # FOR UPDATE where the dialect has it (SQLAlchemy renders none on SQLite).
        self._read_back: sa.Executable = (
            sa.select(t.c.holder, t.c.token, t.c.expires_at, now.label("now"))
            .where(t.c.key == key)
            .with_for_update()
        )

        mine = sa.and_(t.c.key == key, t.c.holder == holder, t.c.token == token)
        refresh = sa.update(t).where(mine, t.c.expires_at > now).values(expires_at=now + ttl)
        self._refresh_update: sa.Executable = refresh
        self._refresh_returning: sa.Executable | None = (
            refresh.returning(t.c.expires_at) if self._refresh_returns() else None
        )

        zero = sa.literal_column("0", sa.BigInteger())
        release = sa.update(t).where(mine, t.c.expires_at > zero)
        self._release: sa.Executable = self._release_statement(release).values(expires_at=zero)

        self._get: sa.Executable = sa.select(t.c.holder, t.c.token, t.c.expires_at).where(
            t.c.key == key, t.c.expires_at > now
        )

    def _returning(self, conn: sa.Connection, kind: str) -> bool:
        if self._use_returning is False:
            return False
        d = conn.dialect
        if kind == "insert":
            return bool(d.insert_returning)
        return bool(d.update_returning)

    # -- connections -------------------------------------------------------------

    @contextmanager
    def _begin(self, single: bool) -> Iterator[sa.Connection]:
        """A connection in a transaction, committed on exit.

        ``single``: the work is one statement, which on PostgreSQL runs in
        autocommit (the "transaction" is then free: no BEGIN, no COMMIT).
        """
        if self._conn is not None:
            with self._lock:
                if self.autocommit and self._conn.invalidated:
                    # Reconnect now (SQLAlchemy would on next use) and put the
                    # new DBAPI connection in autocommit too.
                    self._conn.execution_options(isolation_level="AUTOCOMMIT")
                with self._conn.begin():
                    yield self._conn
        else:
            with (self._single if single else self._engine).begin() as conn:
                yield conn

    def _run(self, work: Callable[[sa.Connection], _T], single: bool = False) -> _T:
        """Run ``work`` in a transaction (a dialect's service may retry it)."""
        with self._begin(single) as conn:
            return work(conn)

    def _fast(self, operation: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """The operation's rows on a dialect's fast path; None: take the
        ordinary path (none here)."""
        return None

    # -- the LeaseService protocol ---------------------------------------------

    def close(self) -> None:
        """Close the engine's pooled connections; a connection you gave is yours to close."""
        if self._conn is None:
            self._engine.dispose(close=True)

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder`` unless another holder's lease is live."""
        params = {"lease_key": key, "lease_holder": holder, "ttl_ms": ttl_millis(ttl)}
        rows = self._fast("acquire", params)
        if rows is not None:
            if not rows:
                return None
            row = rows[0]
            return Lease(key, holder, int(row.token), _to_datetime(int(row.expires_at)))

        def work(conn: sa.Connection) -> Lease | None:
            if self._returning(conn, "insert"):
                assert self._acquire_returning is not None
                row = conn.execute(self._acquire_returning, params).first()
            else:
                conn.execute(self._acquire_upsert, params)
                row = conn.execute(self._read_back, params).first()
            # PostgreSQL/SQLite return no row when the WHERE refused the
            # update; MariaDB and the read-back return the row as it stands.
            if row is None or row.holder != holder:
                return None
            return Lease(key, holder, int(row.token), _to_datetime(int(row.expires_at)))

        return self._run(work, single=self._single_statement)

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend ``lease`` if it is still live and still this holder's and token's."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
            "ttl_ms": ttl_millis(ttl),
        }
        rows = self._fast("refresh", params)
        if rows is not None:
            return _lease_with(lease, int(rows[0].expires_at)) if rows else None

        def work(conn: sa.Connection) -> Lease | None:
            if self._refresh_returning is not None and self._returning(conn, "update"):
                expires = conn.execute(self._refresh_returning, params).scalar()
                if expires is None:
                    return None
                return _lease_with(lease, int(expires))
            conn.execute(self._refresh_update, params)
            row = conn.execute(self._read_back, params).first()
            return _judge_read_back(lease, row)

        return self._run(work, single=self._single_statement)

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still its current lease; the token stays."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
        }
        if self._fast("release", params) is not None:
            return
        with self._begin(single=True) as conn:
            conn.execute(self._release, params)

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, judged on the database clock."""
        params = {"lease_key": key}
        rows = self._fast("get", params)
        if rows is not None:
            if not rows:
                return None
            row = rows[0]
            return Lease(key, row.holder, int(row.token), _to_datetime(int(row.expires_at)))
        with self._begin(single=True) as conn:
            row = conn.execute(self._get, params).first()
        if row is None:
            return None
        return Lease(key, row.holder, int(row.token), _to_datetime(int(row.expires_at)))

    # -- helpers ---------------------------------------------------------------

    @property
    def table(self) -> sa.Table:
        """The lease table this service uses."""
        return self._table

    def create_schema(self) -> None:
        """Create the lease table if missing: for tests and SQLite.

        Servers get their tables from the migrations, not from here.
        """
        with self._begin(single=False) as conn:
            self._table.metadata.create_all(conn, tables=[self._table])


def _lease_with(lease: Lease, expires_ms: int) -> Lease:
    return Lease(lease.key, lease.holder, lease.token, _to_datetime(expires_ms))


def _judge_read_back(lease: Lease, row: sa.Row[Any] | None) -> Lease | None:
    """After a guarded UPDATE: the refresh took iff the row is still ours and live.

    A (holder, token) pair that was lapsed or released can never become live
    again (the next grant bumps the token), so a live row with our holder and
    token means our own UPDATE matched.
    """
    if row is None:
        return None
    holder, token, expires_at, now = row.holder, row.token, row.expires_at, row.now
    if holder != lease.holder or int(token) != lease.token or int(expires_at) <= int(now):
        return None
    return _lease_with(lease, int(expires_at))


def lease_class_for(dialect_name: str) -> type[SQLLeaseService]:
    """The lease service class for a dialect: the one place a dialect is chosen."""
    if dialect_name == "postgresql":
        from .sql_postgres import PostgresLeaseService

        return PostgresLeaseService
    if dialect_name in ("mysql", "mariadb"):
        from .sql_mysql import MySQLLeaseService

        return MySQLLeaseService
    if dialect_name == "sqlite":
        return SQLLeaseService
    raise ValueError(f"SQLLeaseService does not support {dialect_name!r} databases")
