"""``store_for(engine)``: the workflow store for an engine's database.

The one place the store's class is chosen by dialect (from
:func:`pikku_celery.sql.dialect.create`): PostgreSQL and MySQL/MariaDB get
their own store, which does in fewer round trips what the portable
:class:`~.sql.SQLWorkflowStore` does; SQLite runs the portable store as it is.
Apart from :mod:`.sql` so the portable store never imports the stores built
on it. Each dialect's store is imported only when chosen: its driver's
modules come with it, and an install has only the drivers of its extras.
"""

from __future__ import annotations

import sqlalchemy as sa

from ..sql.dialect import create
from ..sql.pooler import Pooler
from .sql import SQLWorkflowStore


def _store_class(dialect: str) -> type[SQLWorkflowStore]:
    """The store class for ``dialect`` (its module imported now)."""
    if dialect == "postgresql":
        from .sql_postgres import PostgresWorkflowStore

        return PostgresWorkflowStore
    if dialect == "mysql":
        from .sql_mysql import MySQLWorkflowStore

        return MySQLWorkflowStore
    return SQLWorkflowStore


def store_for(
    engine: sa.Engine,
    *,
    create_tables: bool | None = None,
    upgrade_command: str | None = None,
    durable_claims: bool = False,
    pooler: Pooler | None = None,
) -> SQLWorkflowStore:
    """The workflow store for ``engine``'s database, built with the options
    :class:`~.sql.SQLWorkflowStore` takes; touches no database.

    An engine of a database pikku does not run on raises ``ValueError``.
    """
    chosen = _store_class(create(engine).name)
    return chosen(
        engine,
        create_tables=create_tables,
        upgrade_command=upgrade_command,
        durable_claims=durable_claims,
        pooler=pooler,
    )
