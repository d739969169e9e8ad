"""A Django project with pikku installed, driven through its own ``manage.py``.

``check`` and ``makemigrations`` touch no database; ``migrate`` makes pikku's
tables beside Django's; ``manage.py test`` runs the project's view test on the
test database, where the view's run is written, and leaves the development
database as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.services import PG_ADMIN_URL, scratch_database

PROJECT = Path(__file__).parent / "django_project"
REPO = Path(__file__).resolve().parents[2]


ENGINES = {
    "postgresql": "django.db.backends.postgresql",
    "sqlite": "django.db.backends.sqlite3",
}


@pytest.fixture(params=sorted(ENGINES))
def dev_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'dev.db'}", poolclass=sa.pool.NullPool)
        yield engine
        engine.dispose()
        return
    name = f"bakery_{uuid.uuid4().hex[:8]}"
    with scratch_database(PG_ADMIN_URL, name) as url:
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        yield engine
        engine.dispose()
    with scratch_database(PG_ADMIN_URL, f"test_{name}"):
        pass  # drop a test database a failed run may have left


def manage(engine: sa.Engine, *args: str) -> subprocess.CompletedProcess[str]:
    url = engine.url
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PROJECT), str(REPO)]),
        "BAKERY_DB_ENGINE": ENGINES[url.get_backend_name()],
        "BAKERY_DB_NAME": str(url.database),
        "BAKERY_DB_USER": url.username or "postgres",
        "BAKERY_DB_HOST": url.host or "127.0.0.1",
        "BAKERY_DB_PORT": str(url.port or 5432),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def database_exists(engine: sa.Engine, name: str) -> bool:
    with engine.connect() as conn:
        found = conn.execute(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
        return found.first() is not None


def test_check_migrate_and_test_through_manage_py(dev_database: sa.Engine) -> None:
    for args in (("check",), ("makemigrations", "--check", "--dry-run")):
        done = manage(dev_database, *args)
        assert done.returncode == 0, done.stderr
    assert tables(dev_database) == set(), "check/makemigrations must not create tables"

    migrated = manage(dev_database, "migrate", "--noinput")
    assert migrated.returncode == 0, migrated.stderr
    assert "pikku-celery: tables upgraded" in migrated.stdout
    assert {"bakery_order", "pikku_workflow_run", "django_migrations"} <= tables(dev_database)

    tested = manage(dev_database, "test", "bakery", "--noinput", "-v", "2")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "Ran 4 tests" in tested.stderr and "OK" in tested.stderr
    # The run and the order were written to the test database only ...
    with dev_database.connect() as conn:
        runs = conn.execute(sa.text("SELECT count(*) FROM pikku_workflow_run")).scalar_one()
        orders = conn.execute(sa.text("SELECT count(*) FROM bakery_order")).scalar_one()
    assert (runs, orders) == (0, 0)
    workflows_found_as_celery_finds_tasks(dev_database)
    if dev_database.url.get_backend_name() == "sqlite":
        return  # Django's SQLite test database lives in memory
    # ... which Django could drop at the end: pikku held no connection to it.
    assert not database_exists(dev_database, f"test_{dev_database.url.database}")


def shell(engine: sa.Engine, code: str) -> str:
    """What ``code`` prints in ``manage.py shell``: a process of the project
    that imports nothing but its settings (and what ``code`` imports)."""
    done = manage(engine, "shell", "-c", code)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def workflows_found_as_celery_finds_tasks(engine: sa.Engine) -> None:
    """``bakery/tasks.py`` is imported by Celery's ``autodiscover_tasks()``
    only: starting its workflow by name, the CLI and the deploy check find it."""
    get = "from pikku_celery.contrib.django import get_pikku; pikku = get_pikku(); "
    run_id = shell(engine, get + "print(pikku.start('bakery.held_order').run_id)")
    leases = manage(engine, "pikku_celery", "leases", "--json")
    assert leases.returncode == 0, leases.stderr
    assert "bakery.wrap" in {t for q in json.loads(leases.stdout)["queues"] for t in q["tasks"]}
    checked = manage(engine, "pikku_celery", "runs", "check-deploy", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["checked"] == 1
    handle = f"pikku.handle({run_id!r})"
    ended = shell(engine, get + f"{handle}.signal('release', 'loaf'); print({handle}.wait(30))")
    assert ended == "wrapped loaf"
