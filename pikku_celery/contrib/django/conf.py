"""Reading ``settings.PIKKU_CELERY`` and building the project's Pikku from it.

::

    PIKKU_CELERY = {
        "CELERY_APP": "proj.celery.app",  # dotted path (or "module:attr") to the Celery app
        "DATABASE_URL": None,             # default: built from DATABASES[DATABASE]
        "DATABASE": "default",            # the DATABASES alias to build it from
        "OPTIONS": {"step_lease": 60.0},  # passed to Pikku(...) as keywords
        "MIGRATE": True,                  # manage.py migrate makes pikku's tables too
    }

or, when the project already builds its Pikku itself::

    PIKKU_CELERY = {"PIKKU": "proj.workflows.pikku"}

pikku keeps its own SQLAlchemy engine (its own connections) even when it
shares Django's database: its writes must commit on their own schedule, not
ride in Django's request transaction. That is why :func:`start_on_commit`
exists.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ...engine.core import WorkflowEngine
from ...sql.engines import make_engine
from .database_urls import SETTING, database_url
from .follow import close_before_create_or_drop, follow_django_database

if TYPE_CHECKING:
    from celery import Celery

    from ...celery.integration import Pikku

DEFAULTS: dict[str, Any] = {
    "CELERY_APP": None,
    "PIKKU": None,
    "DATABASE_URL": None,
    "DATABASE": "default",
    "OPTIONS": {},
    "MIGRATE": True,
}


def pikku_settings() -> dict[str, Any]:
    """``settings.PIKKU_CELERY`` over the defaults, with unknown keys refused.

    A typo ("DATABSE") would otherwise fall back to a default silently.
    """
    raw = getattr(settings, SETTING, None)
    if raw is None:
        raise ImproperlyConfigured(
            f"settings.{SETTING} is not set: give it at least "
            "{'CELERY_APP': 'proj.celery.app'} or {'PIKKU': 'proj.workflows.pikku'}"
        )
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING} must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.{SETTING} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(DEFAULTS)}"
        )
    conf = {**DEFAULTS, **raw}
    if not isinstance(conf["OPTIONS"], Mapping):
        raise ImproperlyConfigured(f"settings.{SETTING}['OPTIONS'] must be a dict")
    if conf["PIKKU"] is None and conf["CELERY_APP"] is None:
        raise ImproperlyConfigured(
            f"settings.{SETTING} needs 'CELERY_APP' (the Celery app's dotted path) "
            "or 'PIKKU' (the dotted path of a Pikku you built yourself)"
        )
    return conf


def import_object(path: str) -> Any:
    """The object at ``"pkg.module.attr"`` or ``"pkg.module:attr"``."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImproperlyConfigured(f"{path!r} is not a dotted path to an object")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImproperlyConfigured(f"cannot import {module_name!r} (from {path!r}): {exc}") from exc
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImproperlyConfigured(f"{module_name!r} has no attribute {attr!r}") from None
    return obj


def database_url_for_alias(alias: str = "default") -> str:
    """The SQLAlchemy URL of Django's database ``alias``, as Django connects to it.

    Reads ``connections[alias].settings_dict``, which the test runner points
    at the test database, so pikku follows Django there too.
    """
    from django.db import connections

    if alias not in settings.DATABASES:
        raise ImproperlyConfigured(
            f"{SETTING}['DATABASE'] is {alias!r}, which is not in settings.DATABASES"
        )
    connection = connections[alias]
    return database_url(connection.settings_dict, getattr(connection, "vendor", None))


def configured_database_url(conf: Mapping[str, Any] | None = None) -> str:
    """``DATABASE_URL`` from the settings, else the URL built from ``DATABASES``."""
    conf = conf if conf is not None else pikku_settings()
    url = conf["DATABASE_URL"]
    if url:
        return str(url)
    return database_url_for_alias(str(conf["DATABASE"]))


# --- the project's Pikku ----------------------------------------------------


def pikku_from_settings(app: Celery | None = None) -> Pikku:
    """A new Pikku on ``app`` (default: ``CELERY_APP``) configured from the settings.

    Builds; never caches. A Celery app should carry one Pikku, so most code
    wants :func:`get_pikku` instead.
    """
    conf = pikku_settings()
    if app is None:
        if conf["CELERY_APP"] is None:
            raise ImproperlyConfigured(f"settings.{SETTING} has no 'CELERY_APP' to build on")
        app = import_object(str(conf["CELERY_APP"]))
    options = dict(conf["OPTIONS"])
    options.setdefault("upgrade_command", DJANGO_UPGRADE_COMMAND)
    if "store" in options or "engine" in options:
        # A store or engine given in OPTIONS says where the runs live.
        pikku = _build(app, conf["DATABASE_URL"], options)
    elif conf["DATABASE_URL"]:
        pikku = _build(app, str(conf["DATABASE_URL"]), options)
    else:
        alias = str(conf["DATABASE"])
        engine = follow_django_database(make_engine(database_url_for_alias(alias)), alias)
        pikku = _build(app, None, {**options, "engine": engine})
    close_before_create_or_drop(pikku)
    return pikku


def _build(app: Celery, url: str | None, options: dict[str, Any]) -> Pikku:
    """``Pikku(app, url, **options)``; a setting it refuses (``step_lease``
    of zero, say) is a Django configuration error naming OPTIONS. Imported
    from the package, so it comes with durable canvas installed."""
    from ... import Pikku

    try:
        return Pikku(app, url, **options)
    except ValueError as exc:
        raise ImproperlyConfigured(f"settings.{SETTING}['OPTIONS']: {exc}") from exc


DJANGO_UPGRADE_COMMAND = "python manage.py pikku_celery db upgrade"
"""What a Django project runs to make pikku's tables (after ``migrate``)."""

_lock = threading.RLock()
_pikku: WorkflowEngine | None = None


def get_pikku() -> WorkflowEngine:
    """The project's Pikku: ``PIKKU`` if set, else built once from the settings.

    Cached for the process (reset when a test overrides ``PIKKU_CELERY``), so
    every caller shares one engine, one connection pool and one set of
    registered workflows. Typed as the engine a Pikku is, so a test can
    name a broker-less engine from :mod:`pikku_celery.testing` as ``PIKKU``.

    Re-entrant: the Celery app's module may import the workflows module,
    which calls ``get_pikku()`` while the app is still being imported; that
    inner call builds the Pikku and the outer one returns the same.
    """
    global _pikku
    with _lock:
        if _pikku is not None:
            return _pikku
        conf = pikku_settings()
        if conf["PIKKU"] is not None:
            obj = conf["PIKKU"]
            if isinstance(obj, str):
                obj = import_object(obj)
            if not isinstance(obj, WorkflowEngine):
                raise ImproperlyConfigured(
                    f"settings.{SETTING}['PIKKU'] must name a Pikku, not {type(obj).__name__}"
                )
            close_before_create_or_drop(obj)
            _pikku = obj
            return obj
        app = import_object(str(conf["CELERY_APP"]))
        if _pikku is None:  # not built by a re-entrant call during the import
            _pikku = pikku_from_settings(app)
        return _pikku


def reset() -> None:
    """Forget the cached Pikku (the next :func:`get_pikku` builds it again)."""
    global _pikku
    with _lock:
        _pikku = None


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting in (SETTING, "DATABASES"):
        reset()


setting_changed.connect(_on_setting_changed, weak=False, dispatch_uid="pikku_celery.conf")
