"""pikku's engine follows Django's connection settings, as Django's test runner moves them.

A Pikku built at import time (``pikku = get_pikku()`` in a views module) is
built before ``manage.py test`` points ``connections[alias]`` at the test
database. Its engine therefore takes the database to connect to from
``connections[alias].settings_dict`` each time it opens a connection, and a
pooled connection made for other settings is dropped at checkout (the pool's
documented disconnect path), so pikku writes where Django's ORM writes.

Before Django creates or drops a database it opens a connection that names
no database (``destroy_test_db`` through ``_nodb_cursor``, which sends
``connection_created``); pikku then closes every connection it holds there,
the settle listener's LISTEN connection included (:meth:`Pikku.close`), which
PostgreSQL would otherwise count as users of the test database it is about to
drop. A Pikku is usable after closing, so the same moment before the test
database is created costs nothing.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from django.db import connections
from django.db.backends.base.base import NO_DB_ALIAS
from django.db.backends.signals import connection_created

from .database_urls import database_url

if TYPE_CHECKING:
    from ...engine.core import WorkflowEngine

TARGET = "pikku_django_target"
"""Key in a pool record's ``info``: the settings its connection was made for."""

_KEYS = ("NAME", "HOST", "PORT", "USER", "PASSWORD", "OPTIONS")

_following: weakref.WeakSet[sa.Engine] = weakref.WeakSet()
_closing: weakref.WeakSet[WorkflowEngine] = weakref.WeakSet()


def close_before_create_or_drop(pikku: WorkflowEngine) -> None:
    """Close ``pikku`` (:meth:`~pikku_celery.Pikku.close`) whenever Django is
    about to create or drop a database, as its test runner does."""
    _closing.add(pikku)


def target_of(alias: str) -> tuple[Any, ...]:
    """What Django connects ``alias`` to now (compared at every checkout)."""
    settings_dict = connections[alias].settings_dict
    return tuple(settings_dict.get(key) for key in _KEYS)


def follow_django_database(engine: sa.Engine, alias: str) -> sa.Engine:
    """Make ``engine`` connect wherever ``connections[alias]`` points at connect time."""
    built_for = target_of(alias)
    _, built_params = engine.dialect.create_connect_args(engine.url)

    def connect_args_now(cargs: list[Any], cparams: dict[str, Any]) -> tuple[Any, ...]:
        target = target_of(alias)
        if target == built_for:
            return target
        connection = connections[alias]
        url = sa.make_url(database_url(connection.settings_dict, connection.vendor))
        args, params = engine.dialect.create_connect_args(url)
        cargs[:] = list(args)
        for key in built_params:
            cparams.pop(key, None)  # keys another listener added stay
        cparams.update(params)
        return target

    def on_connect(_dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        record.info[TARGET] = connect_args_now(cargs, cparams)

    def on_checkout(_dbapi: Any, record: Any, _proxy: Any) -> None:
        if record.info.get(TARGET) != target_of(alias):
            # The pool discards the connection and opens another for the new target.
            raise sa.exc.DisconnectionError("Django's database settings changed")

    # First among do_connect listeners: others (PyMySQL's client flags) add to
    # the parameters this one swaps.
    sa.event.listen(engine, "do_connect", on_connect, insert=True)
    sa.event.listen(engine, "checkout", on_checkout)
    _following.add(engine)
    return engine


def _close_idle_before_create_or_drop(*, connection: Any, **_: Any) -> None:
    if getattr(connection, "alias", None) == NO_DB_ALIAS:
        for pikku in list(_closing):
            pikku.close()
        for engine in list(_following):
            engine.dispose(close=True)


connection_created.connect(
    _close_idle_before_create_or_drop, weak=False, dispatch_uid="pikku_celery.follow"
)
