"""pikku's tables follow ``manage.py migrate``, so the test database has them too.

Django's test runner builds the test database with ``migrate``; pikku's tables
are not Django migrations, so without this the test database would have none
and the first workflow start would fail. After ``migrate`` of the database
alias pikku's URL is built from, pikku's own migrations run on it (at most
once per database and process: ``flush`` sends ``post_migrate`` too).
``PIKKU_CELERY["MIGRATE"] = False`` turns it off.
"""

from __future__ import annotations

from typing import Any

from .conf import database_url_for_alias, pikku_settings

_upgraded: set[str] = set()


def upgrade_after_migrate(*, using: str, verbosity: int = 1, **_: Any) -> None:
    """Run pikku's migrations on ``using`` when pikku's tables live there."""
    conf = pikku_settings()
    follows_django = conf["PIKKU"] is None and not conf["DATABASE_URL"]
    if not conf["MIGRATE"] or not follows_django or using != conf["DATABASE"]:
        return
    url = database_url_for_alias(using)
    if url in _upgraded:
        return
    from ...store import migrate

    before = migrate.current(url)
    migrate.upgrade(url)
    _upgraded.add(url)
    after = migrate.current(url)
    if verbosity >= 1 and before != after:
        print(f"  pikku-celery: tables upgraded to revision {after} on {using!r}")
