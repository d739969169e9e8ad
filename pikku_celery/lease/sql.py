"""Leases in one SQL table, judged on the database's clock.

Every statement is built once per service (SQLAlchemy Core, cached compiled
forms) and chosen per dialect so that the common operations are one round trip:

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

On PostgreSQL single statements run in autocommit (no BEGIN/COMMIT round
trips) and a release commits without waiting for the WAL flush (see
``_build_statements`` for why that is safe). With psycopg, the four
operations skip SQLAlchemy's execution machinery and psycopg's cursor and run
as prepared statements straight on libpq (``pikku_celery/libpq.py`` says why); errors are
raised as the same SQLAlchemy exceptions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from ..db import now_ms_expr
from ..store.schema import lease_table
from .base import TTL, Lease, ttl_millis

if TYPE_CHECKING:
    from ..libpq import PgStatement

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_T = TypeVar("_T")

# MySQL/MariaDB error codes after which the whole transaction was rolled back
# and may simply be run again: deadlock victim, lock wait timeout.
_MYSQL_RETRYABLE = frozenset({1213, 1205})
_MYSQL_ATTEMPTS = 5


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
    serialised (``hold_lease``'s renewer thread shares it safely), and on
    PostgreSQL it is switched to autocommit.

    ``use_returning``: None picks ``RETURNING`` where the server has it; False
    forces the portable upsert-then-read-back path (tests use it to cover the
    MySQL path on MariaDB).
    """

    def __init__(
        self,
        engine: sa.Engine | sa.Connection,
        table: str = lease_table.name,
        *,
        use_returning: bool | None = None,
    ) -> None:
        bind = engine
        dialect = bind.dialect.name
        if dialect not in ("postgresql", "sqlite", "mysql", "mariadb"):
            raise ValueError(f"SQLLeaseService does not support {dialect!r} databases")
        self._dialect = dialect
        self._table = (
            lease_table
            if table == lease_table.name
            else lease_table.to_metadata(sa.MetaData(), name=table)
        )
        self._use_returning = use_returning
        # PostgreSQL runs each single statement in autocommit: no BEGIN and
        # COMMIT round trips. Switching psycopg to autocommit costs no round
        # trip; on PyMySQL it would cost two, and SQLite's engine issues its
        # own BEGIN IMMEDIATE, so those keep ordinary transactions.
        autocommit = dialect == "postgresql"
        self._autocommit = autocommit
        self._conn: sa.Connection | None = None
        self._lock = threading.Lock()
        if isinstance(bind, sa.Connection):
            self._conn = bind
            if autocommit:
                bind.execution_options(isolation_level="AUTOCOMMIT")
            self._engine = bind.engine
            self._single = bind.engine
        else:
            self._engine = bind
            self._single = (
                bind.execution_options(isolation_level="AUTOCOMMIT") if autocommit else bind
            )
        # Single statements on PostgreSQL need no transaction of their own.
        self._pg_single = autocommit and use_returning is not False
        self._build_statements()
        self._pg: _PgStatements | None = None
        if self._pg_single and bind.dialect.driver == "psycopg":
            self._pg = _PgStatements(self)

    # -- statements, built once ------------------------------------------------

    def _build_statements(self) -> None:
        t = self._table
        now = now_ms_expr(self._dialect)
        key = sa.bindparam("lease_key", type_=t.c.key.type)
        holder = sa.bindparam("lease_holder", type_=t.c.holder.type)
        token = sa.bindparam("lease_token", type_=sa.BigInteger())
        ttl = sa.bindparam("ttl_ms", type_=sa.BigInteger())
        one = sa.literal_column("1", sa.BigInteger())
        values = {"key": key, "holder": holder, "token": one, "expires_at": now + ttl}

        upsert: Any
        if self._dialect in ("postgresql", "sqlite"):
            ins: Any = (
                postgresql.insert(t) if self._dialect == "postgresql" else sqlite.insert(t)
            ).values(values)
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
            self._acquire_returning: sa.Executable | None = upsert.returning(
                t.c.holder, t.c.token, t.c.expires_at
            )
        else:
            # MySQL assigns left to right and each assignment sees the columns
            # already assigned, so token and holder are judged on the old
            # expiry first, and expires_at last (by then holder is the new
            # one exactly when this acquire won). UTC_TIMESTAMP() is fixed for
            # the whole statement, so every "now" here is the same instant.
            lapsed = t.c.expires_at <= now
            upsert = (
                mysql.insert(t)
                .values(values)
                .on_duplicate_key_update(
                    [
                        ("token", sa.case((lapsed, t.c.token + one), else_=t.c.token)),
                        ("holder", sa.case((lapsed, holder), else_=t.c.holder)),
                        (
                            "expires_at",
                            sa.case(
                                (sa.or_(lapsed, t.c.holder == holder), now + ttl),
                                else_=t.c.expires_at,
                            ),
                        ),
                    ]
                )
            )
            # MariaDB >= 10.5 returns the row as it stands after the upsert,
            # whether or not it changed; MySQL has no RETURNING at all.
            self._acquire_returning = upsert.returning(t.c.holder, t.c.token, t.c.expires_at)
        self._acquire_upsert: sa.Executable = upsert

        read_back = sa.select(t.c.holder, t.c.token, t.c.expires_at, now.label("now")).where(
            t.c.key == key
        )
        if self._dialect in ("mysql", "mariadb", "postgresql"):
            read_back = read_back.with_for_update()
        self._read_back: sa.Executable = read_back

        mine = sa.and_(t.c.key == key, t.c.holder == holder, t.c.token == token)
        refresh = sa.update(t).where(mine, t.c.expires_at > now).values(expires_at=now + ttl)
        self._refresh_update: sa.Executable = refresh
        self._refresh_returning: sa.Executable | None = (
            refresh.returning(t.c.expires_at) if self._dialect in ("postgresql", "sqlite") else None
        )

        zero = sa.literal_column("0", sa.BigInteger())
        release = sa.update(t).where(mine, t.c.expires_at > zero)
        if self._dialect == "postgresql":
            # A release need not wait for the WAL flush: if a crash loses it,
            # the lease merely stays held until its expiry, and the token is
            # untouched. Any later acquire is a durable commit that flushes
            # this one too, so tokens can never be handed out twice.
            # set_config(..., true) is SET LOCAL for this one-statement
            # transaction; it only runs when the row matched.
            release = release.where(
                sa.literal_column("set_config('synchronous_commit', 'off', true)").is_not(None)
            )
        self._release: sa.Executable = release.values(expires_at=zero)

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
                if self._autocommit and self._conn.invalidated:
                    # Reconnect now (SQLAlchemy would on next use) and put the
                    # new DBAPI connection in autocommit too.
                    self._conn.execution_options(isolation_level="AUTOCOMMIT")
                with self._conn.begin():
                    yield self._conn
        else:
            with (self._single if single else self._engine).begin() as conn:
                yield conn

    def _run(self, work: Callable[[sa.Connection], _T], single: bool = False) -> _T:
        """Run ``work`` in a transaction; rerun it if MySQL chose it as a deadlock victim."""
        for attempt in range(1, _MYSQL_ATTEMPTS + 1):
            try:
                with self._begin(single) as conn:
                    return work(conn)
            except sa.exc.OperationalError as exc:
                code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
                if (
                    self._dialect not in ("mysql", "mariadb")
                    or code not in _MYSQL_RETRYABLE
                    or attempt == _MYSQL_ATTEMPTS
                ):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the PostgreSQL fast path ----------------------------------------------

    def _pg_run(self, stmt: PgStatement, params: dict[str, Any]) -> list[Any] | None:
        """Run one statement straight on libpq (see ``pikku_celery/libpq.py``); its rows.

        None: this call takes the general path instead (a value libpq cannot
        take as text, execution event listeners to fire or ``echo`` on, a
        transaction left open on the connection).
        """
        from ..libpq import run_direct, run_pooled

        if self._conn is None:
            # No isolation level to set: libpq sends no BEGIN of its own.
            return run_pooled(self._engine, stmt, params)
        with self._lock:
            conn = self._conn
            if conn.invalidated:
                # Reconnect as _begin does, so the connection is in
                # autocommit for the general path too.
                conn.execution_options(isolation_level="AUTOCOMMIT")
            return run_direct(conn, stmt, params)

    # -- the LeaseService protocol ---------------------------------------------

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder`` unless another holder's lease is live."""
        params = {"lease_key": key, "lease_holder": holder, "ttl_ms": ttl_millis(ttl)}
        if self._pg is not None:
            rows = self._pg_run(self._pg.acquire, params)
            if rows is not None:
                if not rows:
                    return None
                _, token, expires = rows[0]
                return Lease(key, holder, int(token), _to_datetime(int(expires)))

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

        return self._run(work, single=self._pg_single)

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend ``lease`` if it is still live and still this holder's and token's."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
            "ttl_ms": ttl_millis(ttl),
        }
        if self._pg is not None:
            rows = self._pg_run(self._pg.refresh, params)
            if rows is not None:
                return _lease_with(lease, int(rows[0][0])) if rows else None

        def work(conn: sa.Connection) -> Lease | None:
            if self._refresh_returning is not None and self._returning(conn, "update"):
                expires = conn.execute(self._refresh_returning, params).scalar()
                if expires is None:
                    return None
                return _lease_with(lease, int(expires))
            conn.execute(self._refresh_update, params)
            row = conn.execute(self._read_back, params).first()
            return _judge_read_back(lease, row)

        return self._run(work, single=self._pg_single)

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still its current lease; the token stays."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
        }
        if self._pg is not None and self._pg_run(self._pg.release, params) is not None:
            return
        with self._begin(single=True) as conn:
            conn.execute(self._release, params)

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, judged on the database clock."""
        params = {"lease_key": key}
        if self._pg is not None:
            rows = self._pg_run(self._pg.get, params)
            if rows is not None:
                if not rows:
                    return None
                holder, token, expires = rows[0]
                return Lease(key, holder, int(token), _to_datetime(int(expires)))
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


class _PgStatements:
    """The four operations' statements, compiled once for libpq (``pikku_celery/libpq.py``)."""

    def __init__(self, svc: SQLLeaseService) -> None:
        # Imported here: psycopg is loaded only by services that use it.
        from ..libpq import PgStatement

        dialect = svc._engine.dialect

        def compiled(stmt: sa.Executable | None) -> PgStatement:
            assert stmt is not None
            return PgStatement.compile(stmt, dialect, "pikku_lease_")

        self.acquire = compiled(svc._acquire_returning)
        self.refresh = compiled(svc._refresh_returning)
        self.release = compiled(svc._release)
        self.get = compiled(svc._get)


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
