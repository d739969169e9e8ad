"""pikku's own Alembic migrations, run programmatically (no alembic.ini).

The version table is ``pikku_alembic_version`` so these migrations never
clash with the application's own Alembic history. Users who prefer one
Alembic environment can add :data:`pikku_celery.sql.schema.metadata` to
theirs instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from ..sql.schema import metadata

VERSION_TABLE = "pikku_alembic_version"
MIGRATIONS_DIR = Path(__file__).parent / "migrations"
HINT = "run: pikku-celery db upgrade"


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Compare only pikku's tables: the application's own are none of ours."""
    if type_ == "table":
        return name in metadata.tables
    return True


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """An Alembic Config pointing at the migrations shipped in the package."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


@contextmanager
def _engine(url: str | sa.URL | sa.Engine) -> Iterator[sa.Engine]:
    if isinstance(url, sa.Engine):
        yield url
        return
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def _migration_context(conn: sa.Connection) -> MigrationContext:
    return MigrationContext.configure(
        conn,
        opts={
            "version_table": VERSION_TABLE,
            "include_object": include_object,
            "compare_type": True,
        },
    )


def head() -> str:
    """The newest revision shipped in this package."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    return ",".join(heads)


@contextmanager
def _migrating(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A transaction to migrate in. On SQLite with foreign keys enforced, they
    are off meanwhile: a table rebuilt in batch mode is dropped while others
    still refer to it (the pragma is a no-op inside a transaction)."""
    with engine.connect() as conn:
        # on the driver's connection, outside any transaction SQLAlchemy begins
        raw: Any = conn.connection.driver_connection
        enforced = conn.dialect.name == "sqlite" and bool(
            raw.execute("PRAGMA foreign_keys").fetchone()[0]
        )
        if enforced:
            raw.execute("PRAGMA foreign_keys=OFF")
        try:
            with conn.begin():
                yield conn
        finally:
            if enforced:
                raw.execute("PRAGMA foreign_keys=ON")


def upgrade(url: str | sa.URL | sa.Engine, revision: str = "head") -> None:
    """Create or upgrade pikku's tables to ``revision``."""
    with _engine(url) as engine, _migrating(engine) as conn:
        command.upgrade(alembic_config(conn), revision)


def downgrade(url: str | sa.URL | sa.Engine, revision: str) -> None:
    """Take pikku's tables back to ``revision`` (each migration's own downgrade)."""
    with _engine(url) as engine, _migrating(engine) as conn:
        command.downgrade(alembic_config(conn), revision)


def ensure_current(engine: sa.Engine) -> None:
    """Bring an embedded (SQLite) database to the head revision.

    Tables made before migrations were recorded (by ``metadata.create_all``)
    are stamped as they are, so a later ``db upgrade`` continues from there.
    """
    with _migrating(engine) as conn:
        found = _migration_context(conn).get_current_heads()
        if found and ",".join(found) == head():
            return
        cfg = alembic_config(conn)
        if not found and "pikku_workflow_run" in sa.inspect(conn).get_table_names():
            command.stamp(cfg, "head")
        else:
            command.upgrade(cfg, "head")


def current(url: str | sa.URL | sa.Engine) -> str | None:
    """The revision the database is at, or None if never upgraded."""
    with _engine(url) as engine, engine.connect() as conn:
        heads = _migration_context(conn).get_current_heads()
    return ",".join(heads) if heads else None


@dataclass(frozen=True)
class SchemaCheck:
    """The outcome of ``db check``: true when the tables match the newest revision."""

    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok


def check(url: str | sa.URL | sa.Engine) -> SchemaCheck:
    """Is the database at the head revision with no drift from the schema?

    Truthy when up to date; ``message`` says what is wrong otherwise.
    """
    with _engine(url) as engine, engine.connect() as conn:
        ctx = _migration_context(conn)
        at = ",".join(ctx.get_current_heads()) or None
        diffs = compare_metadata(ctx, metadata)
    want = head()
    if diffs:
        listed = "; ".join(_describe(d) for d in diffs)
        if at is None:
            return SchemaCheck(False, f"pikku-celery's tables are missing ({listed}); {HINT}")
        return SchemaCheck(False, f"schema differs from pikku-celery {want}: {listed}")
    if at is None:
        return SchemaCheck(
            True,
            f"tables match revision {want} (not stamped in {VERSION_TABLE}: "
            "managed by another Alembic environment?)",
        )
    if at != want:
        return SchemaCheck(False, f"database is at revision {at}, the package ships {want}; {HINT}")
    return SchemaCheck(True, f"up to date (revision {at})")


def _describe(diff: Any) -> str:
    if isinstance(diff, list):  # modifications of one column come grouped
        return ", ".join(_describe(d) for d in diff)
    op = diff[0]
    rest = diff[1:]
    target = rest[0]
    name = getattr(target, "name", None) or (rest[2] if len(rest) > 2 else target)
    return f"{op} {name}"
