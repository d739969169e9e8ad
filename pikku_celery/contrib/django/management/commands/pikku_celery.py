"""``manage.py pikku_celery ...``: the ``pikku-celery`` CLI on this project's settings.

Every argument goes to the CLI unchanged (``manage.py pikku_celery db
upgrade``, ``manage.py pikku_celery runs list --json``); the command only
points the CLI at the project, for the duration of the call: ``PIKKU_APP``
names the project's Pikku (``pikku_celery.contrib.django:pikku``, built from
``PIKKU_CELERY`` on first use) and ``PIKKU_DATABASE_URL`` its database. An
explicit ``-A`` or ``--database-url`` still wins, as click options beat their
environment variables.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any

import click
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

APP_PATH = "pikku_celery.contrib.django:pikku"
HELP_FLAGS = {"--help", "-h", "--version"}

# BaseCommand.execute()/run_from_argv() read these; the CLI never sees them.
_DJANGO_DEFAULTS: dict[str, Any] = {
    "verbosity": 1,
    "settings": None,
    "pythonpath": None,
    "traceback": False,
    "no_color": False,
    "force_color": False,
    "skip_checks": False,
}
# Django's own options: --settings/--pythonpath anywhere (manage.py has
# already honoured them wherever they stood), the flags only in front.
_DJANGO_VALUED = ("--settings", "--pythonpath")
_DJANGO_FLAGS = ("--traceback", "--no-color", "--force-color", "--skip-checks")


class PassThroughParser(CommandParser):
    """Hands every argument to the CLI as ``args``, keeping only Django's own options.

    Django's argparse would otherwise answer ``--help`` itself and reject
    the CLI's options (``--json``, ``--database-url``) as unknown.
    """

    def parse_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """Take Django's leading options; pass everything else to the CLI untouched."""
        ns = namespace or argparse.Namespace()
        for key, value in _DJANGO_DEFAULTS.items():
            if not hasattr(ns, key):
                setattr(ns, key, value)
        rest: list[str] = []
        tokens = list(sys.argv[2:] if args is None else args)
        leading = True
        while tokens:
            token = tokens.pop(0)
            name, eq, value = token.partition("=")
            if name in _DJANGO_VALUED:
                if not eq:
                    value = tokens.pop(0) if tokens else ""
                setattr(ns, name[2:], value or None)
            elif leading and token in _DJANGO_FLAGS:
                setattr(ns, token[2:].replace("-", "_"), True)
            else:
                leading = False
                rest.append(token)
        ns.args = rest
        return ns


class Command(BaseCommand):
    """Run the ``pikku-celery`` command line against this project's Pikku."""

    help = (
        "The pikku-celery command line on this project's PIKKU_CELERY settings "
        "(manage.py pikku_celery --help lists its commands)."
    )
    # Like migrate: a database command must not be blocked by unrelated checks.
    requires_system_checks: list[str] = []

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """A parser that passes everything through (see :class:`PassThroughParser`)."""
        return PassThroughParser(
            prog=f"{os.path.basename(prog_name)} {subcommand}",
            description=self.help,
            add_help=False,
            called_from_command_line=self._called_from_command_line,
            **kwargs,
        )

    def print_help(self, prog_name: str, subcommand: str) -> None:
        """``manage.py help pikku_celery`` shows the CLI's own help."""
        self.run_cli(["--help"], f"{os.path.basename(prog_name)} {subcommand}", standalone=False)

    def handle(self, *args: str, **options: Any) -> None:
        """Run the CLI with ``args``; its exit status becomes the command's."""
        prog = f"{os.path.basename(sys.argv[0]) or 'manage.py'} pikku_celery"
        if self._called_from_command_line:
            # click prints its own errors and usage, and exits with its codes.
            self.run_cli(list(args), prog, standalone=True)
            return
        out: IO[str] | None = options.get("stdout")
        err: IO[str] | None = options.get("stderr")
        with (
            contextlib.redirect_stdout(out) if out is not None else contextlib.nullcontext(),
            contextlib.redirect_stderr(err) if err is not None else contextlib.nullcontext(),
        ):
            self.run_cli(list(args), "manage.py pikku_celery", standalone=False)

    def run_cli(self, args: list[str], prog: str, *, standalone: bool) -> None:
        """Invoke ``pikku_celery.cli:main``; errors become ``CommandError`` unless standalone."""
        from pikku_celery.cli import main

        code: object = 0
        with cli_environment(needs_project=not HELP_FLAGS.intersection(args)):
            try:
                if standalone:
                    main.main(args=args, prog_name=prog, standalone_mode=True)
                code = main.main(args=args, prog_name=prog, standalone_mode=False)
            except ImproperlyConfigured as exc:
                # Raised while the CLI loads the project's Pikku (a bad CELERY_APP).
                raise CommandError(str(exc)) from None
            except click.ClickException as exc:
                raise CommandError(exc.format_message(), returncode=exc.exit_code) from None
            except click.exceptions.Abort:
                raise CommandError("aborted", returncode=1) from None
            except SystemExit as exc:
                if standalone:
                    raise
                code = exc.code
        if isinstance(code, int) and code != 0:
            raise CommandError(f"pikku-celery exited with status {code}", returncode=code)
        if isinstance(code, str):
            raise CommandError(code)


@contextlib.contextmanager
def cli_environment(*, needs_project: bool = True) -> Iterator[None]:
    """``PIKKU_APP`` and ``PIKKU_DATABASE_URL`` from the settings, restored afterwards.

    Builds nothing: the CLI loads the Pikku itself when a command needs it
    (``db upgrade`` must work before the tables it checks for exist). The
    database URL is set when the settings give it without building the Pikku;
    with ``PIKKU`` (a Pikku built elsewhere) the CLI takes it from that
    instance, so a stale ``PIKKU_DATABASE_URL`` in the shell is hidden. A
    settings problem is a ``CommandError`` (one line, no traceback), except
    for ``--help``/``--version``, which need no project.
    """
    from ...conf import configured_database_url, pikku_settings

    env: dict[str, str | None] = {"PIKKU_APP": APP_PATH}
    try:
        conf = pikku_settings()
        if conf["PIKKU"] is not None or "engine" in conf["OPTIONS"]:
            env["PIKKU_DATABASE_URL"] = None
        elif "store" not in conf["OPTIONS"] or conf["DATABASE_URL"]:
            env["PIKKU_DATABASE_URL"] = configured_database_url(conf)
    except ImproperlyConfigured as exc:
        if needs_project:
            raise CommandError(str(exc)) from None
    with _environ(env):
        yield


@contextlib.contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, unset) environment variables; put them back afterwards."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
