"""The ``pikku-celery`` command.

A click group; each area is a subgroup (``db`` now; runs, leases, ... later),
so commands can be added without touching the others. Database URLs are
shown with the password masked, always.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import sqlalchemy as sa

from . import __version__

F = TypeVar("F", bound=Callable[..., Any])


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"


def database_url_option(fn: F) -> F:
    """``--database-url`` (or ``PIKKU_DATABASE_URL``), shared by every command."""
    return click.option(
        "--database-url",
        envvar="PIKKU_DATABASE_URL",
        required=True,
        metavar="URL",
        help="SQLAlchemy URL of the workflow database (env: PIKKU_DATABASE_URL).",
    )(fn)


def fail(url: str, exc: Exception) -> click.ClickException:
    """A clean error for a database problem, the password never shown."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    password = sa.make_url(url).password if url else None
    if password:
        text = text.replace(str(password), "***")
    return click.ClickException(f"{masked(url)}: {text}")


@click.group()
@click.version_option(__version__, prog_name="pikku-celery")
def main() -> None:
    """Durable workflows for Celery, kept in your SQL database."""


@main.group()
def db() -> None:
    """Create, upgrade and check pikku-celery's tables."""


@db.command()
@database_url_option
def upgrade(database_url: str) -> None:
    """Create pikku-celery's tables, or upgrade them to this version."""
    from .store import migrate

    try:
        migrate.upgrade(database_url)
        revision = migrate.current(database_url)
    except sa.exc.SQLAlchemyError as exc:
        raise fail(database_url, exc) from None
    click.echo(f"{masked(database_url)}: upgraded to revision {revision}")


@db.command()
@database_url_option
def check(database_url: str) -> None:
    """Exit 0 if the tables match this version of pikku-celery, else 1."""
    from .store import migrate

    try:
        result = migrate.check(database_url)
    except sa.exc.SQLAlchemyError as exc:
        raise fail(database_url, exc) from None
    click.echo(f"{masked(database_url)}: {result.message}")
    if not result.ok:
        raise SystemExit(1)


@db.command()
@database_url_option
def current(database_url: str) -> None:
    """Print the revision the database is at."""
    from .store import migrate

    try:
        revision = migrate.current(database_url)
    except sa.exc.SQLAlchemyError as exc:
        raise fail(database_url, exc) from None
    shown = revision or "none (no pikku-celery tables yet: run pikku-celery db upgrade)"
    click.echo(f"{masked(database_url)}: {shown} (head: {migrate.head()})")


if __name__ == "__main__":  # pragma: no cover
    main()
