"""The embedded broker: Celery messages in an SQLite file, no server to run.

Importing this package registers the ``sqlite-queue://`` URL scheme with kombu::

    import pikku_celery.broker  # noqa: F401

    app = Celery("shop", broker="sqlite-queue:////abs/path/broker.db")  # absolute path
    app = Celery("shop", broker="sqlite-queue:///broker.db")  # relative to the cwd

Without the import, name the transport class instead (Celery's
``broker_transport`` setting, or kombu's ``Connection(..., transport=...)``)::

    app.conf.broker_transport = "pikku_celery.broker.sqlite:Transport"

See :mod:`pikku_celery.broker.sqlite` for the guarantees and the options.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

#: Import path of the transport class, for ``transport=`` / ``broker_transport``.
TRANSPORT = "pikku_celery.broker.sqlite:Transport"

#: URL schemes that select the transport once this package is imported.
SCHEMES = ("sqlite-queue", "pikku-sqlite")

for _scheme in SCHEMES:
    TRANSPORT_ALIASES.setdefault(_scheme, TRANSPORT)

__all__ = ["SCHEMES", "TRANSPORT"]
