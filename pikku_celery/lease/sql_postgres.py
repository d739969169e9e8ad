"""Leases on PostgreSQL: autocommit, a release that skips the WAL flush, libpq.

Only what PostgreSQL does differently from the portable service (:mod:`.sql`):
single statements in autocommit (no BEGIN/COMMIT round trips); a release
that commits without waiting for the WAL flush; with psycopg, the four
operations as prepared statements straight on libpq
(:mod:`pikku_celery.sql.libpq`), raising the same SQLAlchemy exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from .sql import SQLLeaseService

if TYPE_CHECKING:
    from ..sql.libpq import PgStatement


class PostgresLeaseService(SQLLeaseService):
    """The SQL lease service on PostgreSQL (``SQLLeaseService(engine)`` picks it)."""

    autocommit = True

    def _setup(self) -> None:
        self._prepared: dict[str, PgStatement] = {}
        if self._single_statement and self._engine.dialect.driver == "psycopg":
            # Imported here: psycopg is loaded only by services that use it.
            from ..sql.libpq import PgStatement

            statements = {
                "acquire": self._acquire_returning,
                "refresh": self._refresh_returning,
                "release": self._release,
                "get": self._get,
            }
            dialect = self._engine.dialect
            for name, stmt in statements.items():
                assert stmt is not None
                self._prepared[name] = PgStatement.compile(stmt, dialect, "pikku_lease_")

    @property
    def on_libpq(self) -> bool:
        """Whether the four operations run as prepared statements on libpq."""
        return bool(self._prepared)

    def _insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def _release_statement(self, release: sa.Update) -> sa.Update:
        # A release need not wait for the WAL flush: if a crash loses it, the
        # lease merely stays held until its expiry, and the token is
        # untouched. Any later acquire is a durable commit that flushes this
        # one too, so tokens can never be handed out twice. set_config(...,
        # true) is SET LOCAL for this one-statement transaction; it only runs
        # when the row matched.
        return release.where(
            sa.literal_column("set_config('synchronous_commit', 'off', true)").is_not(None)
        )

    def _fast(self, operation: str, params: Mapping[str, Any]) -> Sequence[Any] | None:
        """Run one statement straight on libpq; its rows.

        None: this call takes the general path instead (a value libpq cannot
        take as text, execution event listeners to fire or ``echo`` on, a
        transaction left open on the connection).
        """
        stmt = self._prepared.get(operation)
        if stmt is None:
            return None
        from ..sql.libpq import run_direct, run_pooled

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
