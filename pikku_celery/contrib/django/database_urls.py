"""The SQLAlchemy URL of an entry of Django's ``DATABASES``: the database
pikku shares with the project, reached through pikku's own drivers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

import sqlalchemy as sa
from django.core.exceptions import ImproperlyConfigured

SETTING = "PIKKU_CELERY"
"""The Django setting pikku reads (named in errors that say what to set)."""

# Django-only keys of DATABASES[...]["OPTIONS"]: they mean nothing to the driver.
_DJANGO_ONLY_OPTIONS = {
    "postgresql": {
        "assume_role",
        "isolation_level",
        "pool",
        "server_side_binding",
        "cursor_factory",
        "context",
    },
    "mysql": {"isolation_level", "conv", "client_flag"},
}
# OPTIONS["ssl"] keys that SQLAlchemy's PyMySQL dialect accepts as ssl_<key> in the URL.
_MYSQL_SSL_KEYS = {"ca", "cert", "key", "capath", "cipher", "check_hostname"}


def vendor_of(engine: str) -> str | None:
    """The vendor (as Django's ``connection.vendor``) of a DATABASES ENGINE path."""
    last = engine.rsplit(".", 1)[-1]
    if last in ("postgresql", "postgresql_psycopg2", "postgis"):
        return "postgresql"
    if last == "mysql":
        return "mysql"
    if last in ("sqlite3", "spatialite"):
        return "sqlite"
    return None


def database_url(db: Mapping[str, Any], vendor: str | None = None) -> str:
    """The SQLAlchemy URL for one entry of Django's ``DATABASES``.

    PostgreSQL becomes ``postgresql+psycopg://``, MySQL/MariaDB
    ``mysql+pymysql://``, SQLite ``sqlite:///NAME``. User and password go
    through ``URL.create``, so ``@``, ``:``, ``/`` and ``%`` in them are
    quoted rather than breaking the URL. ``vendor`` (Django's
    ``connection.vendor``) wins over guessing from ``ENGINE``, which lets
    third-party backends of a known database through.
    """
    engine = str(db.get("ENGINE") or "")
    vendor = vendor or vendor_of(engine)
    name = db.get("NAME")
    if vendor == "sqlite":
        return _sqlite_url(name, engine)
    if vendor not in ("postgresql", "mysql"):
        raise ImproperlyConfigured(
            f"cannot build a pikku database URL for ENGINE {engine!r}: pikku supports "
            f"PostgreSQL, MySQL/MariaDB and SQLite; set {SETTING}['DATABASE_URL']"
        )
    host = str(db.get("HOST") or "") or None
    port = db.get("PORT")
    query: dict[str, str] = {}
    if vendor == "mysql":
        query["charset"] = "utf8mb4"  # what Django's MySQL backend uses
    query.update(_driver_options(vendor, db.get("OPTIONS") or {}, engine))
    if host is not None and host.startswith("/"):
        # A Unix socket directory (PostgreSQL) or socket file (MySQL): it cannot
        # be the URL's host, the driver takes it as a connection argument.
        query["host" if vendor == "postgresql" else "unix_socket"] = host
        host = None
    url = sa.engine.URL.create(
        "postgresql+psycopg" if vendor == "postgresql" else "mysql+pymysql",
        username=str(db.get("USER") or "") or None,
        password=str(db.get("PASSWORD") or "") or None,
        host=host,
        port=int(port) if port not in (None, "") else None,
        database=str(name) if name else None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def _sqlite_url(name: Any, engine: str) -> str:
    text = str(name or "")
    if text in ("", ":memory:"):
        raise ImproperlyConfigured(
            f"DATABASES uses a private in-memory SQLite database ({engine}); pikku "
            f"cannot share it. Give it a file NAME or set {SETTING}['DATABASE_URL']"
        )
    if text.startswith("file:"):
        # An SQLite URI, as Django's test runner makes for in-memory test databases.
        path, _, raw_query = text.partition("?")
        query = dict(parse_qsl(raw_query))
        query["uri"] = "true"
        return sa.engine.URL.create("sqlite", database=path, query=query).render_as_string()
    return sa.engine.URL.create("sqlite", database=text).render_as_string()


def _driver_options(vendor: str, options: Mapping[str, Any], engine: str) -> dict[str, str]:
    """DATABASES OPTIONS that the driver understands, as URL query values.

    A value that cannot go in a URL is refused rather than dropped: losing
    ``ssl`` quietly would connect without TLS.
    """
    query: dict[str, str] = {}
    for key, value in options.items():
        if key in _DJANGO_ONLY_OPTIONS[vendor] or value is None:
            continue
        if vendor == "mysql" and key == "ssl" and isinstance(value, Mapping):
            for ssl_key, ssl_value in value.items():
                if ssl_key not in _MYSQL_SSL_KEYS:
                    raise ImproperlyConfigured(
                        f"DATABASES OPTIONS['ssl'][{ssl_key!r}] ({engine}) has no URL form; "
                        f"set {SETTING}['DATABASE_URL']"
                    )
                query[f"ssl_{ssl_key}"] = _scalar(ssl_value)
            continue
        if not isinstance(value, str | int | float | bool):
            raise ImproperlyConfigured(
                f"DATABASES OPTIONS[{key!r}] ({engine}) is a {type(value).__name__}, which has "
                f"no URL form; set {SETTING}['DATABASE_URL']"
            )
        query[key] = _scalar(value)
    return query


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
