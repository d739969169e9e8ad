"""The Flask extension: the Pikku an app's views (and a blueprint made without one) serve."""

from __future__ import annotations

from flask import Flask, current_app
from flask.sansio.app import App

from ..engine.core import WorkflowEngine

EXTENSION_KEY = "pikku_celery"
"""Where :class:`PikkuFlask` registers itself in ``app.extensions``."""

NOT_CONFIGURED = (
    "no PikkuFlask on this app: call PikkuFlask(pikku).init_app(app) or "
    "PikkuFlask(pikku, app) before registering the blueprint, "
    "or pass the Pikku to make_blueprint(pikku, ...)"
)
"""What a blueprint made without a Pikku says on an app that has none."""


class NotConfiguredError(RuntimeError):
    """The app has no :class:`PikkuFlask` for a blueprint made without a Pikku."""


class PikkuFlask:
    """The Flask extension: makes a Pikku reachable from any view of the app.

    Usable directly (``PikkuFlask(pikku, app)``) or in the app-factory
    pattern (``ext = PikkuFlask(); ext.init_app(app, pikku)``).
    """

    def __init__(self, pikku: WorkflowEngine | None = None, app: Flask | None = None) -> None:
        self._pikku = pikku
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, pikku: WorkflowEngine | None = None) -> None:
        """Register with ``app`` as ``app.extensions["pikku_celery"]``."""
        if pikku is not None:
            self._pikku = pikku
        if self._pikku is None:
            raise RuntimeError(
                "PikkuFlask needs a Pikku: PikkuFlask(pikku) or init_app(app, pikku)"
            )
        app.extensions[EXTENSION_KEY] = self

    @property
    def pikku(self) -> WorkflowEngine:
        """The Pikku this extension serves."""
        if self._pikku is None:
            raise RuntimeError("PikkuFlask has no Pikku yet: call init_app(app, pikku)")
        return self._pikku


def has_extension(app: App) -> bool:
    """Does ``app`` hold a :class:`PikkuFlask`?"""
    return isinstance(app.extensions.get(EXTENSION_KEY), PikkuFlask)


def current_pikku() -> WorkflowEngine:
    """The Pikku of the current Flask app (registered by :class:`PikkuFlask`).

    Raises :class:`NotConfiguredError` (a ``RuntimeError``) when there is none.
    """
    ext = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(ext, PikkuFlask):
        raise NotConfiguredError(NOT_CONFIGURED)
    return ext.pikku
