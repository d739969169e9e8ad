"""The Django integration, without pytest-django: settings are configured here, once."""

from __future__ import annotations

import atexit
import io
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import django
import pytest
import sqlalchemy as sa
from celery import Celery
from django.conf import settings

from pikku_celery import PayloadError, RunStatus, UnknownWorkflowError
from pikku_celery.store import InMemoryWorkflowStore

from . import support

DJANGO_DIR = Path(tempfile.mkdtemp(prefix="pikku-django-tests-"))
atexit.register(shutil.rmtree, DJANGO_DIR, ignore_errors=True)

if not settings.configured:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="pikku-celery-tests",
        USE_TZ=True,
        # django.test imports staticfiles, whose lazy storage object raises on
        # first touch without STATIC_URL (code that scans sys.modules touches it).
        STATIC_URL="/static/",
        INSTALLED_APPS=["pikku_celery.contrib.django"],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(DJANGO_DIR / "default.db"),
            },
            "empty": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(DJANGO_DIR / "empty.db"),
            },
        },
        PIKKU_CELERY={"PIKKU": "tests.contrib.support:shop"},
    )
    django.setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.core.management.base import CommandError  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import override_settings  # noqa: E402

from pikku_celery.contrib.django import (  # noqa: E402
    database_url,
    database_url_for_alias,
    get_pikku,
    pikku_from_settings,
    start_on_commit,
)
from pikku_celery.contrib.django.apps import check_settings  # noqa: E402
from pikku_celery.contrib.django.management.commands.pikku_celery import (  # noqa: E402
    PassThroughParser,
)

ORDER_INPUT = {"a": 2, "b": 3}


@pytest.fixture
def shop() -> support.Pikku:
    """The configured Pikku (``PIKKU_CELERY['PIKKU']``)."""
    pikku = get_pikku()
    assert pikku is support.shop
    return support.shop


def run_count(pikku: support.Pikku) -> int:
    return len(pikku.store.list_runs(limit=100_000))


# --- database URLs from DATABASES -------------------------------------------


def pg(**db: Any) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.postgresql", "OPTIONS": {}, **db}


def my(**db: Any) -> dict[str, Any]:
    return {"ENGINE": "django.db.backends.mysql", "OPTIONS": {}, **db}


def test_postgresql_url_has_every_part() -> None:
    url = database_url(pg(NAME="shop", USER="app", PASSWORD="pw", HOST="db.local", PORT="6432"))
    assert url == "postgresql+psycopg://app:pw@db.local:6432/shop"


@pytest.mark.parametrize("password", ["p@ss:w/rd%?#&=", "ä ö", "a+b", "@@::"])
def test_special_characters_in_the_password_survive_the_round_trip(password: str) -> None:
    for db in (pg(NAME="shop", USER="u@x", PASSWORD=password, HOST="h"),
               my(NAME="shop", USER="u@x", PASSWORD=password, HOST="h")):  # fmt: skip
        url = sa.make_url(database_url(db))
        assert url.password == password
        assert url.username == "u@x"
        assert url.host == "h"
        assert url.database == "shop"


def test_postgresql_without_host_or_port_uses_the_local_socket() -> None:
    url = sa.make_url(database_url(pg(NAME="shop", USER="", PASSWORD="", HOST="", PORT="")))
    assert (url.drivername, url.host, url.port, url.username, url.password) == (
        "postgresql+psycopg",
        None,
        None,
        None,
        None,
    )
    assert url.database == "shop"


def test_a_socket_directory_goes_to_the_query_not_the_host() -> None:
    url = sa.make_url(database_url(pg(NAME="shop", HOST="/var/run/postgresql")))
    assert url.host is None
    assert url.query["host"] == "/var/run/postgresql"
    url = sa.make_url(database_url(my(NAME="shop", HOST="/run/mysqld/mysqld.sock")))
    assert url.query["unix_socket"] == "/run/mysqld/mysqld.sock"


def test_postgresql_driver_options_pass_and_django_only_ones_do_not() -> None:
    db = pg(NAME="shop", OPTIONS={"sslmode": "require", "isolation_level": 2, "pool": {"a": 1}})
    url = sa.make_url(database_url(db))
    assert dict(url.query) == {"sslmode": "require"}


def test_postgis_and_third_party_backends_map_by_vendor() -> None:
    db = pg(NAME="geo", ENGINE="django.contrib.gis.db.backends.postgis")
    assert database_url(db).startswith("postgresql+psycopg://")
    db = pg(NAME="x", ENGINE="some_vendor.backends.wrapped")
    assert database_url(db, vendor="postgresql").startswith("postgresql+psycopg://")


def test_mysql_url_uses_pymysql_utf8mb4_and_ssl_options() -> None:
    db = my(
        NAME="shop",
        USER="root",
        PASSWORD="",
        HOST="127.0.0.1",
        PORT=3306,
        OPTIONS={"ssl": {"ca": "/etc/ca.pem"}, "isolation_level": "read committed"},
    )
    url = sa.make_url(database_url(db))
    assert url.drivername == "mysql+pymysql"
    assert (url.host, url.port, url.username, url.password) == ("127.0.0.1", 3306, "root", None)
    assert dict(url.query) == {"charset": "utf8mb4", "ssl_ca": "/etc/ca.pem"}


def test_an_option_without_a_url_form_is_refused_not_dropped() -> None:
    with pytest.raises(ImproperlyConfigured, match="ssl"):
        database_url(my(NAME="shop", OPTIONS={"ssl": {"verify_mode": object()}}))
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_url(pg(NAME="shop", OPTIONS={"sslcontext": object()}))


def test_sqlite_urls() -> None:
    db = {"ENGINE": "django.db.backends.sqlite3", "NAME": Path("/srv/app/db.sqlite3")}
    assert database_url(db) == "sqlite:////srv/app/db.sqlite3"
    assert database_url({**db, "NAME": "rel.db"}) == "sqlite:///rel.db"
    memory = {**db, "NAME": "file:memorydb_default?mode=memory&cache=shared"}
    url = sa.make_url(database_url(memory))
    assert url.database == "file:memorydb_default"
    assert dict(url.query) == {"mode": "memory", "cache": "shared", "uri": "true"}
    for private in (":memory:", ""):
        with pytest.raises(ImproperlyConfigured, match="in-memory"):
            database_url({**db, "NAME": private})


def test_an_unsupported_engine_asks_for_database_url() -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_url({"ENGINE": "django.db.backends.oracle", "NAME": "x"})


def test_the_url_of_an_alias_is_where_django_connects() -> None:
    assert database_url_for_alias("default") == f"sqlite:///{DJANGO_DIR / 'default.db'}"
    with pytest.raises(ImproperlyConfigured, match=r"not in settings\.DATABASES"):
        database_url_for_alias("nope")


# --- building the Pikku from the settings -----------------------------------


def test_pikku_from_settings_uses_the_databases_alias_and_passes_options() -> None:
    conf = {"CELERY_APP": "tests.contrib.support:celery_app", "OPTIONS": {"sweep_interval": 7.0}}
    with override_settings(PIKKU_CELERY=conf):
        app = Celery("from-settings", broker="memory://", set_as_current=False)
        pikku = pikku_from_settings(app)
        assert pikku.app is app
        assert pikku.sql_engine is not None
        assert pikku.sql_engine.url.database == str(DJANGO_DIR / "default.db")
        assert pikku.sweep_interval == 7.0
        assert app.conf.beat_schedule["pikku-sweep"]["schedule"] == 7.0
        pikku.sql_engine.dispose()


def test_step_lease_and_max_lease_come_from_options_and_a_bad_one_is_named() -> None:
    options = {"step_lease": 20, "max_lease": 900, "install_beat": False}
    conf = {"CELERY_APP": "tests.contrib.support:celery_app", "OPTIONS": options}
    with override_settings(PIKKU_CELERY=conf):
        app = Celery("leases", broker="redis://", set_as_current=False)
        pikku = pikku_from_settings(app)
        lease = pikku.lease_for_queue()
        assert (lease.horizon, lease.step_lease, lease.seconds) == (3600.0, 20.0, 20.0)
        assert pikku.lease_bound_ms() == 900_000
        assert pikku.sql_engine is not None
        pikku.sql_engine.dispose()
    bad = {"CELERY_APP": "tests.contrib.support:celery_app", "OPTIONS": {"step_lease": 0}}
    refused = pytest.raises(ImproperlyConfigured, match=r"OPTIONS'\]: step_lease must be a pos")
    with override_settings(PIKKU_CELERY=bad), refused:
        pikku_from_settings(Celery("bad", broker="redis://", set_as_current=False))


def test_get_pikku_builds_once_from_celery_app_and_an_explicit_url() -> None:
    url = f"sqlite:///{DJANGO_DIR / 'explicit.db'}"
    conf = {"CELERY_APP": "tests.contrib.support.celery_app", "DATABASE_URL": url}
    with override_settings(PIKKU_CELERY=conf):
        pikku = get_pikku()
        assert get_pikku() is pikku
        assert pikku.app is support.celery_app  # type: ignore[attr-defined]
        assert str(pikku.sql_engine.url) == url  # type: ignore[attr-defined]
    assert get_pikku() is support.shop  # the override ended: built again from PIKKU


def test_get_pikku_while_the_celery_app_module_is_still_importing() -> None:
    conf = {
        "CELERY_APP": "tests.contrib.reentrant_app:app",
        "OPTIONS": {"store": InMemoryWorkflowStore(), "install_beat": False},
    }
    with override_settings(PIKKU_CELERY=conf):
        pikku = get_pikku()
        from . import reentrant_app

        assert reentrant_app.pikku is pikku
        assert pikku.app is reentrant_app.app  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        (None, "is not set"),
        ({"DATABSE": "x", "CELERY_APP": "a.b"}, "unknown key"),
        ({"DATABASE": "default"}, "needs 'CELERY_APP'"),
        ({"CELERY_APP": "no_such_module_here.app"}, "cannot import"),
        ({"PIKKU": "tests.contrib.support:celery_app"}, "must name a Pikku"),
    ],
)
def test_bad_settings_are_clear(conf: dict[str, Any] | None, message: str) -> None:
    with override_settings(PIKKU_CELERY=conf), pytest.raises(ImproperlyConfigured, match=message):
        get_pikku()


def test_the_system_check_reports_bad_settings_without_importing_anything() -> None:
    assert check_settings() == []
    with override_settings(PIKKU_CELERY={"CELERY_APP": "not_imported.ever", "TYPO": 1}):
        errors = check_settings()
    assert [e.id for e in errors] == ["pikku_celery.E001"]
    assert "TYPO" in errors[0].msg


# --- start_on_commit ----------------------------------------------------------


def order_workflow(pikku: support.Pikku) -> Any:
    return pikku.registry.get(support.ORDER)


def test_starts_only_when_the_transaction_commits(shop: support.Pikku) -> None:
    before = run_count(shop)
    with transaction.atomic():
        pending = start_on_commit(order_workflow(shop), ORDER_INPUT, idempotency_key="o-1")
        assert not pending.started
        assert run_count(shop) == before
        with pytest.raises(RuntimeError, match="has not committed"):
            _ = pending.run_id
    assert pending.started
    assert pending.handle is not None
    assert pending.handle.status() == RunStatus.RUNNING
    assert pending.handle.state().idempotency_key == "o-1"
    assert run_count(shop) == before + 1
    assert [s.name for s in shop.store.get_steps(pending.run_id)] == ["add"]


def test_nothing_starts_when_the_transaction_rolls_back(shop: support.Pikku) -> None:
    before = run_count(shop)
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        pending = start_on_commit(order_workflow(shop), ORDER_INPUT)
        1 / 0  # noqa: B018
    assert not pending.started
    assert run_count(shop) == before


def test_a_rolled_back_savepoint_drops_its_start_but_not_the_outer_one(
    shop: support.Pikku,
) -> None:
    before = run_count(shop)
    with transaction.atomic():
        outer = start_on_commit(support.ORDER, {"a": 1, "b": 1})  # by name: get_pikku()
        try:
            with transaction.atomic():
                inner = start_on_commit(order_workflow(shop), {"a": 9, "b": 9})
                raise ValueError("roll back the savepoint")
        except ValueError:
            pass
    assert outer.started
    assert not inner.started
    assert run_count(shop) == before + 1


def test_outside_a_transaction_it_starts_at_once(shop: support.Pikku) -> None:
    pending = start_on_commit(order_workflow(shop), ORDER_INPUT)
    assert pending.started
    assert shop.handle(pending.run_id).status() == RunStatus.RUNNING


def test_a_timeout_becomes_the_runs_deadline_from_its_start_after_commit(
    shop: support.Pikku,
) -> None:
    with transaction.atomic():
        with pytest.raises(ValueError, match="timeout"):
            start_on_commit(order_workflow(shop), ORDER_INPUT, timeout=0)
        pending = start_on_commit(order_workflow(shop), ORDER_INPUT, timeout=600)
    assert pending.handle is not None
    state = pending.handle.state()
    assert state.deadline_at == state.created_at + 600_000


def test_bad_input_is_refused_inside_the_transaction(shop: support.Pikku) -> None:
    before = run_count(shop)
    with transaction.atomic():
        with pytest.raises(PayloadError, match="input"):
            start_on_commit(order_workflow(shop), {"a": object()})
        with pytest.raises(UnknownWorkflowError, match="no workflow is registered"):
            start_on_commit("no.such.workflow", {})
        with pytest.raises(PayloadError, match="idempotency_key"):
            start_on_commit(order_workflow(shop), {}, idempotency_key=7)  # type: ignore[arg-type]
    assert run_count(shop) == before


def test_the_run_completes_after_commit(shop: support.Pikku) -> None:
    with transaction.atomic():
        pending = start_on_commit(order_workflow(shop), ORDER_INPUT)
    assert support.run_scheduled_steps(shop, pending.run_id) == 1
    shop.send_signal(pending.run_id, "approval", {"by": "alice"})
    shop.orchestrate(pending.run_id, "test")
    assert pending.handle is not None
    assert pending.handle.wait(timeout=5) == {"total": 5, "approval": {"by": "alice"}}


# --- manage.py pikku_celery -----------------------------------------------------


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("pikku_celery", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_the_command_shows_the_cli_help() -> None:
    text = cli("--help")
    assert "manage.py pikku_celery" in text
    for group in ("db", "runs", "signal"):
        assert group in text
    assert "db upgrade" in cli("db", "--help") or "upgrade" in cli("db", "--help")


def test_db_commands_use_the_database_built_from_databases() -> None:
    conf = {"CELERY_APP": "tests.contrib.support:celery_app", "DATABASE": "empty"}
    before = dict(os.environ)
    with override_settings(PIKKU_CELERY=conf):
        # No tables yet: db check fails with exit status 1.
        with pytest.raises(CommandError) as failed:
            cli("db", "check")
        assert failed.value.returncode == 1
        assert "empty.db" in cli("db", "upgrade")
        assert "empty.db" in cli("db", "check")
        assert "head" in cli("db", "current")
    assert dict(os.environ) == before  # PIKKU_APP / PIKKU_DATABASE_URL were put back


def test_the_command_points_the_cli_at_the_configured_pikku(shop: support.Pikku) -> None:
    handle = shop.start(support.ORDER, ORDER_INPUT)
    listed = cli("runs", "list", "--json")
    assert handle.run_id in listed
    assert handle.run_id in cli("runs", "show", handle.run_id, "--json")


def test_cli_errors_become_command_errors() -> None:
    with pytest.raises(CommandError, match="No such command"):
        cli("no-such-command")
    with override_settings(PIKKU_CELERY={"TYPO": 1}), pytest.raises(CommandError, match="TYPO"):
        cli("db", "check")
    with override_settings(PIKKU_CELERY={"TYPO": 1}):
        assert "db" in cli("--help")  # help needs no project


def test_the_parser_keeps_only_djangos_leading_options() -> None:
    parser = PassThroughParser(prog="manage.py pikku_celery", add_help=False)
    ns = parser.parse_args(
        ["--traceback", "--settings", "proj.settings", "runs", "list", "--json", "--no-color"]
    )
    assert ns.traceback is True
    assert ns.settings == "proj.settings"
    assert ns.no_color is False
    assert ns.args == ["runs", "list", "--json", "--no-color"]
    ns = parser.parse_args(["-A", "proj:pikku", "db", "check", "--pythonpath=/srv"])
    assert ns.args == ["-A", "proj:pikku", "db", "check"]
    assert ns.pythonpath == "/srv"
