"""The Django app: add ``"pikku_celery.contrib.django"`` to ``INSTALLED_APPS``.

Installing it makes the ``pikku_celery`` management command available and
registers a system check that catches a misconfigured ``PIKKU_CELERY`` at
start-up rather than at the first workflow start.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class PikkuCeleryConfig(AppConfig):
    """pikku-celery's app config (label ``pikku_celery``; it has no models)."""

    name = "pikku_celery.contrib.django"
    label = "pikku_celery"
    verbose_name = "pikku-celery workflows"

    def ready(self) -> None:
        """Register the settings check, so a bad ``PIKKU_CELERY`` shows at start-up,
        and make pikku's tables with ``migrate``."""
        from django.db.models.signals import post_migrate

        from .schema import upgrade_after_migrate

        checks.register(check_settings)
        post_migrate.connect(
            upgrade_after_migrate, sender=self, dispatch_uid="pikku_celery.migrate"
        )


def check_settings(app_configs: Any = None, **_: Any) -> list[checks.CheckMessage]:
    """``PIKKU_CELERY`` is a dict of known keys naming an app or a Pikku.

    Imports nothing and connects to nothing: it only reads settings.
    """
    from .conf import pikku_settings

    try:
        pikku_settings()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="pikku_celery.E001")]
    return []
