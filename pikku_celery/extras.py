"""Which optional extra brings which backend's libraries.

The core installs no database driver and no broker client: each backend comes
with an extra (``pip install 'pikku-celery[postgres]'``). A backend used
without its extra fails with an error that names the command to run, instead
of a bare ``No module named ...`` from deep inside a driver.
"""

from __future__ import annotations

import importlib

from celery import Celery

from .errors import PikkuError

EXTRA_OF_MODULE = {
    "psycopg": "postgres",
    "psycopg_binary": "postgres",
    "psycopg2": "postgres",
    "pymysql": "mysql",
    "redis": "redis",
    "packaging": "redis",  # kombu's Redis transport imports it
    "boto3": "sqs",
    "botocore": "sqs",
    "pycurl": "sqs",
}
"""Top-level module name → the extra that installs it."""

BROKER_EXTRAS = {
    "redis": ("redis", ("redis", "packaging")),
    "rediss": ("redis", ("redis", "packaging")),
    "sentinel": ("redis", ("redis", "packaging")),
    "sqs": ("sqs", ("boto3", "pycurl")),
}
"""Broker transport alias → its extra and the modules the transport needs."""


class MissingExtraError(PikkuError, ImportError):
    """A backend is used whose optional dependencies are not installed.

    An ``ImportError`` too, so code that guards an optional import still
    catches it; its message names the ``pip install`` command.
    """

    def __init__(self, what: str, extra: str, missing: str | None = None) -> None:
        self.extra = extra
        cause = f" ({missing} is not installed)" if missing else ""
        super().__init__(
            f"{what} needs pikku-celery's {extra!r} extra{cause}: {install_hint(extra)}"
        )


def install_hint(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'pikku-celery[{extra}]'"


def extra_for(exc: ImportError) -> str | None:
    """The extra that would have provided the module ``exc`` failed to import."""
    name = (exc.name or "").partition(".")[0]
    return EXTRA_OF_MODULE.get(name)


def require_broker_extra(app: Celery, transport: str) -> None:
    """Raise :class:`MissingExtraError` if ``transport``'s client libraries are missing.

    Only importability is checked: nothing connects.
    """
    needs = BROKER_EXTRAS.get(transport)
    if needs is None:
        return  # amqp (Celery's own py-amqp), memory, filesystem, pikku's SQLite broker
    extra, modules = needs
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise MissingExtraError(f"the {transport!r} broker", extra, module) from None
