"""Leases in one SQL table, judged on the database's clock.

Every statement is named in one registry (:mod:`.statements`) and run through
the narrow connector (:mod:`pikku_celery.sql.connector`), so the common
operations are one round trip where the database allows:

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

What differs per database is the engine's :class:`~pikku_celery.sql.dialect.Dialect`:
the upsert's spelling, autocommit and libpq's prepared statements on
PostgreSQL, a deadlock victim run again on MySQL. This module has no branch
on a database's name.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..ports.lease import TTL, Lease, ttl_millis
from ..sql.connector import Connector, LibpqConnector, Transaction, connect
from ..sql.schema import lease_table
from . import statements as st

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _to_datetime(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


class SQLLeaseService:
    """Leases in table ``pikku_lease`` (SQLite, PostgreSQL, MySQL/MariaDB).

    One row per key: ``holder``, fencing ``token`` and ``expires_at`` in epoch
    milliseconds on the database clock (PostgreSQL ``clock_timestamp()``,
    MySQL/MariaDB ``UTC_TIMESTAMP(6)``, SQLite the host clock). Release sets
    ``expires_at`` to 0 but keeps the row, so the next holder's token is
    still one higher than the last.

    ``engine`` is an Engine (each operation checks out a connection), one
    Connection the service keeps for itself, e.g. one per worker thread (that
    saves the pool checkout per operation; calls on it are serialised, so
    ``hold_lease``'s renewer thread shares it safely), or a
    :class:`~pikku_celery.sql.connector.Connector` of your own (a test's
    :class:`~pikku_celery.sql.recording.RecordingConnector`).

    ``use_returning``: None uses ``RETURNING`` where the server has it; False
    takes the upsert-then-read-back path (tests use it to cover the MySQL
    path on MariaDB and SQLite).
    """

    def __init__(
        self,
        engine: sa.Engine | sa.Connection | Connector,
        table: str = lease_table.name,
        *,
        use_returning: bool | None = None,
    ) -> None:
        self._table = (
            lease_table
            if table == lease_table.name
            else lease_table.to_metadata(sa.MetaData(), name=table)
        )
        self.connector = (
            engine if isinstance(engine, Connector) else connect(engine, prefix="pikku_lease_")
        )
        """What runs the statements (named ``lease.*``: :mod:`.statements`)."""
        self.dialect = self.connector.dialect
        """The engine's :class:`~pikku_celery.sql.dialect.Dialect`."""
        self.connector.register(st.lease_statements(self.dialect, self._table))
        self._use_returning = use_returning is not False

    def named_statements(self) -> dict[str, sa.Executable]:
        """Every statement the service runs, by name (checks over them refer
        to a statement by its name)."""
        return {
            name: stmt
            for name, stmt in self.connector.registry.items()
            if name.startswith("lease.")
        }

    @property
    def on_libpq(self) -> bool:
        """Whether lone statements run as prepared statements on libpq."""
        return isinstance(self.connector, LibpqConnector)

    # -- the LeaseService protocol ---------------------------------------------

    def close(self) -> None:
        """Close the engine's pooled connections; a connection you gave is yours to close."""
        self.connector.close()

    def acquire(self, key: str, holder: str, ttl: TTL) -> Lease | None:
        """Grant ``key`` to ``holder`` unless another holder's lease is live."""
        params = {"lease_key": key, "lease_holder": holder, "ttl_ms": ttl_millis(ttl)}
        if self._use_returning and self.dialect.insert_returning:
            row = self.connector.one(st.ACQUIRE, params)
        else:

            def upsert_then_read(tx: Transaction) -> Any:
                tx.run(st.ACQUIRE_UPSERT, params)
                return tx.one(st.READ_BACK, params)

            row = self.connector.transaction(upsert_then_read)
        # PostgreSQL/SQLite return no row when the WHERE refused the update;
        # MariaDB and the read-back return the row as it stands.
        if row is None or row.holder != holder:
            return None
        return Lease(key, holder, int(row.token), _to_datetime(int(row.expires_at)))

    def refresh(self, lease: Lease, ttl: TTL) -> Lease | None:
        """Extend ``lease`` if it is still live and still this holder's and token's."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
            "ttl_ms": ttl_millis(ttl),
        }
        if self._use_returning and self.dialect.update_returning:
            row = self.connector.one(st.REFRESH, params)
            return None if row is None else _lease_with(lease, int(row.expires_at))

        def update_then_read(tx: Transaction) -> Any:
            tx.run(st.REFRESH_UPDATE, params)
            return tx.one(st.READ_BACK, params)

        return _judge_read_back(lease, self.connector.transaction(update_then_read))

    def release(self, lease: Lease) -> None:
        """Free the key if ``lease`` is still its current lease; the token stays."""
        params = {
            "lease_key": lease.key,
            "lease_holder": lease.holder,
            "lease_token": lease.token,
        }
        self.connector.run(st.RELEASE, params)

    def get(self, key: str) -> Lease | None:
        """The live lease on ``key``, judged on the database clock."""
        row = self.connector.one(st.GET, {"lease_key": key})
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
        self.connector.create_tables([self._table])


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
