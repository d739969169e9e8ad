"""Which database errors mean "run the whole transaction again"."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

# PostgreSQL: deadlock detected, serialization failure.
ROLLED_BACK_STATES = frozenset({"40P01", "40001"})
# MySQL/MariaDB: deadlock victim, lock wait timeout.
ROLLED_BACK_CODES = frozenset({1213, 1205})
# MySQL/MariaDB: SAVEPOINT ... does not exist.
SAVEPOINT_GONE = 1305


def rolled_back(exc: BaseException) -> bool:
    """The database gave up this transaction to let another through (a
    deadlock victim, a lock wait timed out): once the ``with`` block that
    opened it has rolled back, running the block again is safe."""
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in ROLLED_BACK_STATES:
        return True
    args: tuple[Any, ...] = tuple(getattr(orig, "args", ()))
    return bool(args) and args[0] in ROLLED_BACK_CODES


def savepoint_lost(exc: BaseException) -> bool:
    """The database rolled the whole transaction back under a savepoint (a
    MySQL/MariaDB deadlock victim inside it), so releasing the savepoint
    failed: run the transaction again, as for any deadlock victim."""
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
    return bool(args) and args[0] == SAVEPOINT_GONE
