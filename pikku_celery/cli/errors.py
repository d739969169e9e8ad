"""How the command line words a failure: one clean line, the passwords of
database URLs scrubbed, exit code 2 for a service that cannot be used."""

from __future__ import annotations

import click
import sqlalchemy as sa


class ServiceError(click.ClickException):
    """A database or broker could not be reached or used: exit code 2."""

    exit_code = 2


def masked(url: str | sa.URL) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"


def url_password(url: str | sa.URL | None) -> str | None:
    """The password in a database URL, if any (so it can be scrubbed)."""
    if not url:
        return None
    try:
        password = sa.make_url(url).password
    except sa.exc.ArgumentError:
        return None
    return str(password) if password else None


def first_line(exc: BaseException) -> str:
    """The first line of an error: drivers append SQL and hints below it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret (a database password) replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def fail(url: str, exc: BaseException) -> ServiceError:
    """A clean error for a database problem, the password never shown."""
    return ServiceError(f"{masked(url)}: {scrub(first_line(exc), [url_password(url) or ''])}")
