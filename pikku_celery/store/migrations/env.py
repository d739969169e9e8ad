"""Alembic environment for pikku-celery's tables.

Run through :mod:`pikku_celery.store.migrate` (``pikku-celery db ...``), which
passes a connection in ``config.attributes``. Its version table is
``pikku_alembic_version``, apart from the application's own.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from pikku_celery.sql.schema import metadata
from pikku_celery.store.migrate import VERSION_TABLE, include_object

config = context.config


def _configure(**kwargs: object) -> None:
    context.configure(
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_object=include_object,
        compare_type=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: sa.Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = sa.create_engine(
        config.get_main_option("sqlalchemy.url") or "", poolclass=sa.pool.NullPool
    )
    with engine.begin() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
