"""pikku-celery for Flask: an extension and an optional JSON blueprint.

Both live in :mod:`pikku_celery.web` (:mod:`~pikku_celery.web.flask_blueprint`); here
is where a Flask app imports them from.

::

    pikku_ext = PikkuFlask()           # module level

    def create_app() -> Flask:
        app = Flask(__name__)
        pikku_ext.init_app(app, pikku)  # app.extensions["pikku_celery"] is pikku_ext
        app.register_blueprint(         # after init_app, or make_blueprint(pikku, ...)
            make_blueprint(permission=lambda action, target: current_user.is_staff),
            url_prefix="/api",
        )
        return app

A blueprint made without a Pikku serves the app's :class:`PikkuFlask`, so
registering it on an app that has none raises ``RuntimeError`` at once
(initialise the extension first, or pass the Pikku to ``make_blueprint``).

The blueprint's endpoints (all JSON in and out):

- ``POST /workflows/<name>/runs`` with ``{"input": ..., "idempotency_key": ...}``:
  start (202). ``"input"`` is required (``{"input": null}`` for none);
  ``"idempotency_key"`` is optional, and a key already used returns its run,
  or 409 ``conflict`` (with that ``run_id``) when the input differs.
- ``GET /runs/<run_id>``: status, output or error, steps with their attempts
- ``POST /runs/<run_id>/signals/<name>`` with the payload as the body (none: null):
  signal (202)
- ``POST /runs/<run_id>/cancel``: ask the run to cancel (202; a settled run is 409)

A 202 carries the run as JSON and its status URL as ``Location``.

``make_blueprint(..., run_page=True)`` adds the run page: ``/`` (the page,
``?run=<id>`` for one run), ``/assets/<name>`` and its JSON API under
``/api/`` (runs list with counts, one run whole, cancel, retry, signal; see
:mod:`pikku_celery.web.api`), on this blueprint's hook, body limit and error
handling.

A request body over the size limit is refused with 413 before any of it is
read, and before anything else: the limit is ``make_blueprint(max_body_bytes=...)``,
by default the engine's ``max_input_bytes`` plus room for the envelope (and
no more than the app's ``MAX_CONTENT_LENGTH`` when that is set). A body sent
chunked, without a ``Content-Length``, is refused as soon as its read
passes the limit.

Each endpoint then asks ``permission(action, target)`` (action ``"start"``,
``"status"``, ``"signal"`` or ``"cancel"``; target the workflow name or the
run id exactly as it appears in the path) and answers 403 when it says no.
It runs before the body is parsed or anything is looked up, so a refused
caller learns nothing, not even whether the run exists; the hook can read
``flask.request`` for more (the signal's name is ``request.view_args["name"]``).

Every error the blueprint answers is JSON ``{"error": code, "message": ...}``
with its status, never Flask's HTML page: bad input is a 4xx (400
``bad_request``, ``invalid_body``, ``invalid_json``, ``invalid_payload`` or
``invalid_run_id``; 403 ``forbidden``; 404 ``unknown_workflow`` or
``unknown_run``; 409 ``run_settled`` or ``conflict``; 413
``payload_too_large``; 415 ``unsupported_media_type``), never a 500. A
database that stays unreachable for the engine's ``outage_timeout`` is 503
``store_unavailable`` with ``Retry-After`` (see ``docs/outages.md``). A path
under the blueprint that matches no endpoint is 404 ``not_found``, a method
an endpoint does not take is 405 ``method_not_allowed`` (with ``Allow``);
the app's other routes keep their own error pages. A bug is 500
``internal_error`` (details in the server's log, not the answer); a
blueprint whose app lost its :class:`PikkuFlask` is 500 ``not_configured``.
The blueprint does no CSRF protection: use token authentication, or put
CSRF checks in front.
"""

from __future__ import annotations

from ..web.api import ENVELOPE_BYTES
from ..web.flask_blueprint import make_blueprint
from ..web.flask_errors import HTTP_ERROR_CODES
from ..web.flask_ext import EXTENSION_KEY, NotConfiguredError, PikkuFlask, current_pikku
from ..web.permissions import Permission
from ..web.workflow_api import START_KEYS

__all__ = [
    "ENVELOPE_BYTES",
    "EXTENSION_KEY",
    "HTTP_ERROR_CODES",
    "START_KEYS",
    "NotConfiguredError",
    "Permission",
    "PikkuFlask",
    "current_pikku",
    "make_blueprint",
]
