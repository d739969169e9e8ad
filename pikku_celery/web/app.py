"""The run page as a WSGI app of its own (what ``pikku-celery web`` serves).

A Flask app holding :func:`~.flask_blueprint.make_blueprint` with
``run_page=True`` at its root: the page at ``/``, its API under ``/api/``,
and the blueprint's own JSON endpoints beside them. Nothing else: no app
static folder, no other routes.
"""

from __future__ import annotations

from flask import Flask

from ..engine.core import WorkflowEngine
from .flask_blueprint import make_blueprint
from .flask_ext import PikkuFlask
from .permissions import READ_ACTIONS, STEER_ACTIONS, Permission


def loopback_permission(allow_actions: bool) -> Permission:
    """The hook of a page served with no hook of its own (on loopback, or
    with ``--allow-remote``): everyone reads; actions only if allowed.

    Starting runs is never allowed this way: the page does not start runs.
    """

    def permission(action: str, target: str) -> bool:
        return action in READ_ACTIONS or (allow_actions and action in STEER_ACTIONS)

    return permission


def create_app(
    pikku: WorkflowEngine,
    permission: Permission,
    *,
    max_body_bytes: int | None = None,
) -> Flask:
    """A Flask app serving the run page over ``pikku`` behind ``permission``."""
    app = Flask(__name__, static_folder=None)
    PikkuFlask(pikku, app)
    app.register_blueprint(
        make_blueprint(
            pikku,
            permission=permission,
            name="pikku_celery_web",
            run_page=True,
            max_body_bytes=max_body_bytes,
        )
    )
    return app
