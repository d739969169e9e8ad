"""``pikku-celery web``: serve the run page on waitress, safe by default.

``pikku-celery -A proj web --host 127.0.0.1 --port 5555``. Without a
permission hook it binds only to loopback (``--allow-remote`` overrides)
and is read-only (``--allow-actions`` lets the page cancel, retry and
signal). With ``--permission MODULE:ATTR`` the hook ``permission(action,
target) -> bool`` decides every read and action (see
:mod:`pikku_celery.web.permissions`). ``--database-url`` names the store
the page shows; without ``-A`` the page is read-only whatever the hook
says, since actions send the run's wake-up through the app's Celery app
(see :mod:`pikku_celery.web.readonly`).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from ..engine.core import WorkflowEngine
from .common import database_url_option, friendly_errors, state
from .errors import ServiceError

DEFAULT_PORT = 5555
"""Flower's port: the page plays the same part."""


def load_permission(spec: str) -> Any:
    """The hook at ``MODULE:ATTR`` (the current directory importable, as for ``-A``)."""
    module_name, colon, attr = spec.strip().partition(":")
    if not module_name or not colon or not attr:
        raise click.BadParameter(f"{spec!r} is not MODULE:ATTR", param_hint="--permission")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--permission"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise click.BadParameter(
                f"{module_name!r} has no attribute {attr!r}", param_hint="--permission"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise click.BadParameter(
            f"{spec!r} is a {type(obj).__name__}, not a permission(action, target) -> bool "
            "function",
            param_hint="--permission",
        )
    return obj


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port to listen on (0: any free port).",
)
@click.option(
    "--permission",
    "permission_spec",
    metavar="MODULE:ATTR",
    envvar="PIKKU_WEB_PERMISSION",
    help="A permission(action, target) -> bool hook deciding every read and action "
    "(env: PIKKU_WEB_PERMISSION); it can read flask.request.",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Without a hook: let the page cancel, retry and signal runs (default: read-only).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help="Without a hook: bind beyond loopback anyway (put an authenticating proxy in front).",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 64),
    default=4,
    show_default=True,
    help="Requests served at once.",
)
@database_url_option
@friendly_errors
def web(
    host: str,
    port: int,
    permission_spec: str | None,
    allow_actions: bool,
    allow_remote: bool,
    threads: int,
) -> None:
    """Serve the run page: runs, their timelines, and (if allowed) actions.

    Binds to 127.0.0.1 by default. Without --permission it refuses any other
    address unless --allow-remote, and is read-only unless --allow-actions.
    """
    try:
        import waitress  # type: ignore[import-untyped]  # noqa: F401 - to say what is missing

        from ..web.app import create_app, loopback_permission
    except ImportError as exc:
        raise click.ClickException(
            f"the run page needs Flask and waitress ({exc}): pip install 'pikku-celery[web]'"
        ) from None
    from ..web.readonly import WHY, read_only_engine, reads_only
    from ..web.serve import Exposure, HostGuard, RemoteBindError, make_server

    if permission_spec and allow_actions:
        raise click.UsageError(
            "--allow-actions is for a page without a hook; with --permission the hook "
            "decides each action"
        )
    exposure = Exposure(host, permission_spec is not None, allow_remote, allow_actions)
    try:
        exposure.check()
    except RemoteBindError as exc:
        raise click.UsageError(str(exc)) from None
    permission = (
        load_permission(permission_spec) if permission_spec else loopback_permission(allow_actions)
    )
    cli = state()
    pikku: WorkflowEngine
    if cli.database_url and not cli.has_app:
        if allow_actions:
            raise click.UsageError(
                "--allow-actions needs -A: the page's actions send the run's wake-up "
                "through your Celery app"
            )
        pikku, permission = read_only_engine(cli.store()), reads_only(permission)
    else:
        pikku = cli.workflows("the page's actions send the run's wake-up through your Celery app")
    app: Any = create_app(pikku, permission)
    if exposure.guard_hosts:
        app = HostGuard(app)
    try:
        server = make_server(app, host, port, threads)
    except OSError as exc:
        raise ServiceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"serving the run page on http://{shown}:{server.port}/")
    click.echo(exposure.describe())
    if not cli.has_app:
        click.echo(f"read-only: {WHY}")
    server.serve_until_interrupted()
