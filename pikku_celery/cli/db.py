"""``pikku-celery db upgrade | check | current``: pikku's own Alembic migrations.

The URL comes from ``--database-url`` (or ``PIKKU_DATABASE_URL``), else from
the ``-A`` app's Pikku; it is shown with the password masked, always.
Database failures exit 2 (``check`` exits 1 for a schema that is behind).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click
import sqlalchemy as sa

from .common import database_url_option, state
from .errors import fail, masked

T = TypeVar("T")


def resolve_url() -> str:
    """The explicit URL, else the one the ``-A`` app's Pikku was built with."""
    s = state()
    if s.database_url:
        return s.database_url
    if s.pikku is None and not s.app_spec:
        raise click.UsageError(
            "Missing option '--database-url' (env: PIKKU_DATABASE_URL), "
            "or -A/--app to take it from your app's Pikku."
        )
    pikku = s.engine()  # building a Pikku touches no database: fine before its tables exist
    if pikku.sql_engine is None:
        raise click.UsageError(
            "the app's Pikku has no SQL engine (it was given a store=); pass --database-url"
        )
    return pikku.sql_engine.url.render_as_string(hide_password=False)


def _guarded(url: str, action: Callable[[], T]) -> T:
    """``action()``, a database failure (or a missing driver) as one masked line."""
    try:
        return action()
    except (sa.exc.SQLAlchemyError, ImportError) as exc:
        raise fail(url, exc) from None


@click.group()
def db() -> None:
    """Create, upgrade and check pikku-celery's tables."""


@db.command()
@database_url_option
def upgrade() -> None:
    """Create pikku-celery's tables, or upgrade them to this version."""
    from ..store import migrate

    url = resolve_url()

    def run() -> tuple[str | None, str | None, migrate.SchemaCheck]:
        before = migrate.current(url)
        migrate.upgrade(url)
        return before, migrate.current(url), migrate.check(url)

    before, after, checked = _guarded(url, run)
    if before == after:
        click.echo(f"{masked(url)}: already at revision {after}, nothing to upgrade")
    elif before is None:
        click.echo(f"{masked(url)}: created the tables, upgraded to revision {after}")
    else:
        click.echo(f"{masked(url)}: upgraded from revision {before} to revision {after}")
    if not checked.ok:
        # At the head revision yet different from it (a column dropped or
        # changed by hand): migrations will not repair that on their own.
        click.echo(
            f"{masked(url)}: but the tables differ from revision {after}: {checked.message}",
            err=True,
        )
        raise SystemExit(1)


@db.command()
@database_url_option
def check() -> None:
    """Exit 0 if the tables match this version of pikku-celery, else 1."""
    from ..store import migrate

    url = resolve_url()
    result = _guarded(url, lambda: migrate.check(url))
    click.echo(f"{masked(url)}: {result.message}")
    if not result.ok:
        raise SystemExit(1)


@db.command()
@database_url_option
def current() -> None:
    """Print the revision the database is at."""
    from ..store import migrate

    url = resolve_url()
    revision = _guarded(url, lambda: migrate.current(url))
    shown = revision or "none (no pikku-celery tables yet: run pikku-celery db upgrade)"
    click.echo(f"{masked(url)}: {shown} (head: {migrate.head()})")
