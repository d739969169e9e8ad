"""Leases on PostgreSQL: autocommit, a release that skips the WAL flush, libpq.

Only what PostgreSQL does differently from the portable service (:mod:`.sql`):
single statements in autocommit (no BEGIN/COMMIT round trips); a release
that commits without waiting for the WAL flush; with psycopg, the four
operations as prepared statements straight on libpq
(:mod:`pikku_celery.sql.libpq`), raising the same SQLAlchemy exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from ..sql.runner import LibpqRunner, Runner, SQLAlchemyRunner
from .sql import SQLLeaseService


class PostgresLeaseService(SQLLeaseService):
    """The SQL lease service on PostgreSQL (``SQLLeaseService(engine)`` picks it)."""

    autocommit = True

    def _setup(self) -> None:
        self._statements = {
            "acquire": self._acquire_returning,
            "refresh": self._refresh_returning,
            "release": self._release,
            "get": self._get,
        }
        self.runner: Runner | None = None
        """How the four operations run, when they run as single statements."""
        if not self._single_statement:
            return
        fallback = SQLAlchemyRunner(lambda: self._begin(single=True))
        self.runner = fallback
        if self._engine.dialect.driver == "psycopg":
            self.runner = LibpqRunner(
                self._engine,
                fallback,
                prefix="pikku_lease_",
                connection=self._conn,
                lock=self._lock,
            )

    @property
    def on_libpq(self) -> bool:
        """Whether the four operations run as prepared statements on libpq."""
        return isinstance(self.runner, LibpqRunner)

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
        """The operation as one statement in autocommit, through the runner."""
        if self.runner is None:
            return None
        return self.runner.rows(self._statements[operation], params)
