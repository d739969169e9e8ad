"""Leases on MySQL/MariaDB: an upsert assigned left to right, a deadlock retried.

Only what MySQL does differently from the portable service (:mod:`.sql`): its
``INSERT ... ON DUPLICATE KEY UPDATE`` (MariaDB >= 10.5 returns the row;
MySQL has no RETURNING, so the row is read back), a refresh read back, and a
transaction the server rolled back as a deadlock victim run again (PostgreSQL's
single statements in autocommit have no such victims).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from ..retry import ROLLED_BACK
from ..sql.transient import rolled_back
from .sql import SQLLeaseService

_T = TypeVar("_T")


class MySQLLeaseService(SQLLeaseService):
    """The SQL lease service on MySQL/MariaDB (``SQLLeaseService(engine)`` picks it)."""

    def _upsert(self, values: dict[str, Any], ttl: Any, one: Any) -> tuple[Any, Any]:
        # MySQL assigns left to right and each assignment sees the columns
        # already assigned, so token and holder are judged on the old expiry
        # first, and expires_at last (by then holder is the new one exactly
        # when this acquire won). UTC_TIMESTAMP() is fixed for the whole
        # statement, so every "now" here is the same instant.
        t, now, holder = self._table, self._now, self._holder
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
        return upsert, upsert.returning(t.c.holder, t.c.token, t.c.expires_at)

    def _refresh_returns(self) -> bool:
        return False

    def _run(self, work: Callable[[sa.Connection], _T], single: bool = False) -> _T:
        """Run ``work`` in a transaction; again if the server rolled it back
        as a deadlock victim (:data:`pikku_celery.retry.ROLLED_BACK`)."""
        return ROLLED_BACK.call(
            lambda: super(MySQLLeaseService, self)._run(work, single), rolled_back
        )
