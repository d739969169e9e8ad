"""A scratch database for a Pikku store: made for a test session, dropped after.

``admin_url`` names a server and a database to connect to while making the
new one (PostgreSQL or MySQL/MariaDB), or is an SQLite URL, whose file
becomes the store (``sqlite://`` alone: a file in a temporary folder).
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa


@contextlib.contextmanager
def scratch_database(admin_url: str, name: str | None = None) -> Iterator[str]:
    """Create database ``name`` (random if None) with pikku's tables; yield its URL; drop it."""
    from pikku_celery.store.migrate import upgrade

    url = sa.engine.make_url(admin_url)
    name = name or f"pikku_test_{uuid.uuid4().hex[:12]}"
    if url.get_backend_name() == "sqlite":
        with contextlib.ExitStack() as stack:
            if not url.database or url.database == ":memory:":
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="pikku-store-"))
                url = url.set(database=str(Path(folder) / f"{name}.db"))
            rendered = url.render_as_string(hide_password=False)
            upgrade(rendered)
            yield rendered
        return
    # No pool: the server may be restarted while the database is in use.
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        scratch = url.set(database=name).render_as_string(hide_password=False)
        try:
            upgrade(scratch)
            yield scratch
        finally:
            with admin.connect() as conn:
                if url.get_backend_name() == "postgresql":
                    conn.exec_driver_sql(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
                    )
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    finally:
        admin.dispose()
