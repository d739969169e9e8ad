"""The ``pikku-celery`` command.

A click group reading the app the way ``celery -A`` does; each area is a
module of its own (``db``, ``runs``, ``ops``) so commands can be added without
touching the others. Database URLs are shown with the password masked, always.
"""

from __future__ import annotations

import click

from .. import __version__
from .common import CliState
from .db import db
from .errors import masked
from .events import run_events
from .ops import leases, signal, sweep
from .prune import prune_command
from .runs import runs
from .schedules import schedules
from .web import web

__all__ = ["CliState", "main", "masked"]


@click.group()
@click.version_option(__version__, prog_name="pikku-celery")
@click.option(
    "-A",
    "--app",
    "app_spec",
    envvar="PIKKU_APP",
    metavar="MODULE[:ATTR]",
    help="Module holding your Pikku instance, as with celery -A (env: PIKKU_APP).",
)
@click.pass_context
def main(ctx: click.Context, app_spec: str | None) -> None:
    """Durable workflows for Celery, kept in your SQL database."""
    if isinstance(ctx.obj, CliState):
        if app_spec:
            ctx.obj.app_spec = app_spec
    else:
        ctx.obj = CliState(app_spec=app_spec)


main.add_command(db)
main.add_command(runs)
main.add_command(signal)
main.add_command(sweep)
main.add_command(leases)
main.add_command(web)
runs.add_command(prune_command)
runs.add_command(run_events)
main.add_command(schedules)


if __name__ == "__main__":  # pragma: no cover
    main()
