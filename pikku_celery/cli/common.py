"""What every command shares: the app it works on, its options and its errors.

Errors reach the user as one clean line and a non-zero exit code, never a
traceback: 1 for a refused request (unknown run, settled run, bad payload), 2
for bad usage or an unreachable service (database, broker). Passwords of the
database and broker URLs are scrubbed from every message.

Every command takes ``--database-url`` (``PIKKU_DATABASE_URL``): the workflow
store to work on instead of the app's database. Reading (``runs list``, ``runs
show``, ``leases``) needs nothing else; what sends messages (``runs cancel``,
``runs retry``, ``signal``, ``sweep``) still needs ``-A``, whose Celery app
carries them: the app's Pikku is then moved onto that store. The CLI never
creates tables there (only ``db upgrade`` does).
"""

from __future__ import annotations

import copy
import functools
import getpass
import json
import os
import socket
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import click
import sqlalchemy as sa
from click.core import ParameterSource
from kombu.exceptions import OperationalError as BrokerOperationalError

from ..engine.run_ids import parse_run_id
from ..errors import PikkuError, SchemaMissingError, StoreUnavailableError
from ..model.values import Operator
from .errors import ServiceError, first_line, masked, scrub, url_password

if TYPE_CHECKING:
    from ..celery.integration import Pikku
    from ..ports.store import WorkflowStore

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    # Newer click makes ParamType generic; older releases cannot subscript it.
    ParamTypeBase = click.ParamType[Any]
else:
    ParamTypeBase = click.ParamType


NEEDS_APP = "pass -A/--app MODULE[:ATTR] (as with celery -A) or set PIKKU_APP"


@dataclass
class CliState:
    """``ctx.obj``: the ``-A`` spec, the Pikku it names once loaded, and the
    running command's ``--database-url``.

    Embedders (a Django management command) can hand a ready engine in with
    ``main.main(args, obj=CliState(pikku=engine))``.
    """

    app_spec: str | None = None
    pikku: Pikku | None = None
    database_url: str | None = field(default=None, init=False)
    url_from_env: bool = field(default=False, init=False)
    _url_engine: sa.Engine | None = field(default=None, init=False, repr=False)
    _url_store: WorkflowStore | None = field(default=None, init=False, repr=False)
    _moved: Pikku | None = field(default=None, init=False, repr=False)
    _noted: bool = field(default=False, init=False, repr=False)

    @property
    def has_app(self) -> bool:
        """Whether ``-A`` (or an embedder's Pikku) names the app."""
        return self.pikku is not None or bool(self.app_spec)

    def engine(self) -> Pikku:
        """The app's Pikku, imported on first use (``--help`` imports nothing)."""
        if self.pikku is None:
            if not self.app_spec:
                raise click.UsageError(f"this command needs your app: {NEEDS_APP}")
            from .app_loader import load_pikku

            self.pikku = load_pikku(self.app_spec)
        return self.pikku

    def store(self) -> WorkflowStore:
        """The store a reading command reads: ``--database-url``'s, else the app's.

        Without ``-A`` the URL alone does: reading needs no Celery app.
        """
        if self.database_url and not self.has_app:
            return self._url_parts()[1]
        if not self.has_app:
            raise click.UsageError(
                f"this command needs your app or its database: {NEEDS_APP}, "
                "or pass --database-url URL (env: PIKKU_DATABASE_URL)"
            )
        return self.workflows().store

    def workflows(self, why: str | None = None) -> Pikku:
        """The Pikku a command works through: the app's, moved onto the store
        at ``--database-url`` when that names another database.

        The app supplies what the URL cannot: its Celery app (broker, routes,
        queue leases) and its options. ``why`` says what the command sends
        through it, for the usage error when only the URL was given.
        """
        if self.database_url and not self.has_app:
            raise click.UsageError(
                f"--database-url alone is not enough here: {why or 'this command needs your app'}"
                f"; {NEEDS_APP} as well (nothing was changed)"
            )
        pikku = self.engine()
        if not self.database_url or _same_database(pikku, self.database_url):
            return pikku
        if self._moved is None:
            engine, store = self._url_parts()
            self._moved = _moved_onto(pikku, engine, store)
        return self._moved

    def set_database_url(self, url: str | None, from_env: bool) -> None:
        """The running command's ``--database-url`` (callback of the option)."""
        if url != self.database_url:
            self._close_url()
        self.database_url, self.url_from_env = url or None, from_env

    def _url_parts(self) -> tuple[sa.Engine, WorkflowStore]:
        """An engine and store on ``--database-url``, built once per command.

        ``create_tables=False``: an SQLite URL that names the wrong file must
        not become an empty database; only ``db upgrade`` makes tables.
        """
        url = self.database_url
        assert url is not None
        if self._url_engine is None or self._url_store is None:
            from ..errors import StoreError
            from ..sql.engines import make_engine
            from ..store.sql_for import store_for

            try:  # its errors never quote the URL (parsing's would, password and all)
                engine = make_engine(url)
            except StoreError as exc:
                raise ServiceError(f"--database-url: {first_line(exc)}") from None
            _refuse_missing_sqlite_file(engine.url)
            self._url_engine = engine
            self._url_store = store_for(engine, create_tables=False)
            click.get_current_context().call_on_close(self._close_url)
        if self.has_app and self.url_from_env and not self._noted:
            self._noted = True
            click.echo(
                f"note: PIKKU_DATABASE_URL is set: working on the workflow store at "
                f"{masked(url)}, not the app's database",
                err=True,
            )
        return self._url_engine, self._url_store

    def _close_url(self) -> None:
        """Close the URL's connections when its command ends."""
        if self._url_engine is not None:
            self._url_engine.dispose()
        self._url_engine = self._url_store = self._moved = None
        self._noted = False

    def secrets(self) -> list[str]:
        """Passwords of the database and broker URLs in use, to scrub from output."""
        found: list[str] = [url_password(self.database_url) or ""]
        if self.pikku is not None:
            if self.pikku.sql_engine is not None:
                found.append(url_password(self.pikku.sql_engine.url) or "")
            for url in (self.pikku.app.conf.broker_url, self.pikku.app.conf.broker_write_url):
                if isinstance(url, str):
                    with suppress(ValueError):
                        found.append(urlsplit(url).password or "")
        return [s for s in found if s]

    def database_label(self) -> str:
        """The database URL in use, masked, to prefix database errors with."""
        if self._url_engine is not None:
            return masked(self._url_engine.url)
        engine = self.pikku.sql_engine if self.pikku is not None else None
        return masked(engine.url) if engine is not None else "workflow store"


def _same_database(pikku: Pikku, url: str) -> bool:
    """Whether ``url`` names the database the app's Pikku was built on (a
    Django project sets ``PIKKU_DATABASE_URL`` to it): then nothing moves."""
    if pikku.sql_engine is None:
        return False
    try:
        return sa.make_url(url) == pikku.sql_engine.url
    except sa.exc.ArgumentError:
        return False


def _moved_onto(pikku: Pikku, engine: sa.Engine, store: WorkflowStore) -> Pikku:
    """The app's Pikku with its store and leases on ``engine``.

    A copy, not ``Pikku(app, url)``: a second Pikku would re-register tasks
    and beat on the app and lose the app's options (``message_grace``,
    ``queue_leases``, ``orchestration_queue``...), which decide what a sweep
    sends and where. The run and sweep leases live beside the runs, in that
    database, as for any Pikku built from a URL.
    """
    from ..engine.keeper import StepLeaseKeeper
    from ..lease.sql import SQLLeaseService
    from ..schedule.sql import SQLScheduleStore

    moved = copy.copy(pikku)
    moved.sql_engine = engine
    moved.store = store
    moved.leases = SQLLeaseService(engine)
    moved.keeper = StepLeaseKeeper(store)
    moved.schedule_store = SQLScheduleStore(engine)
    return moved


def _refuse_missing_sqlite_file(url: sa.URL) -> None:
    """An SQLite path that does not exist is a typo, not a new empty store."""
    from ..store.sql import UPGRADE_COMMAND

    path = url.database
    if url.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return
    if url.query.get("uri") or path.startswith("file:") or os.path.exists(path):
        return
    shown = masked(url)
    raise ServiceError(
        f"{shown}: no such SQLite file (create pikku's tables there with: "
        f"{UPGRADE_COMMAND.format(url=repr(shown))})"
    )


def database_url_option(fn: F) -> F:
    """``--database-url`` (or ``PIKKU_DATABASE_URL``), shared by every command.

    Not passed to the command: it is kept on :class:`CliState`, whose
    ``store()`` and ``workflows()`` honour it.
    """

    def remember(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        from_env = ctx.get_parameter_source(param.name or "") == ParameterSource.ENVIRONMENT
        state().set_database_url(value, from_env)

    return click.option(
        "--database-url",
        envvar="PIKKU_DATABASE_URL",
        metavar="URL",
        expose_value=False,
        callback=remember,
        help=(
            "SQLAlchemy URL of the workflow database (env: PIKKU_DATABASE_URL); "
            "default: the -A app's database."
        ),
    )(fn)


def state() -> CliState:
    """The :class:`CliState` of the running command."""
    ctx = click.get_current_context()
    obj = ctx.find_object(CliState)
    if obj is None:
        obj = ctx.ensure_object(CliState)
    return obj


def friendly_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the library's errors into one clean line and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (SchemaMissingError, StoreUnavailableError) as exc:
            raise ServiceError(scrub(str(exc), state().secrets())) from None
        except PikkuError as exc:
            raise click.ClickException(scrub(str(exc), state().secrets())) from None
        except sa.exc.SQLAlchemyError as exc:
            s = state()
            raise ServiceError(
                f"{s.database_label()}: {scrub(first_line(exc), s.secrets())}"
            ) from None
        except (BrokerOperationalError, ConnectionError) as exc:
            raise ServiceError(
                f"the broker is unreachable: {scrub(first_line(exc), state().secrets())} "
                "(what was already written to the database stands; the beat sweep "
                "sends whatever message is missing)"
            ) from None

    return wrapper


class RunIdType(ParamTypeBase):
    """A workflow run id: refused at parse time when it is not a UUID."""

    name = "RUN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """A run id, or a clear usage error instead of a store lookup that cannot match."""
        try:
            return parse_run_id(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


RUN_ID = RunIdType()


def json_option(fn: F) -> F:
    """``--json``: machine-readable output with stable keys."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        help="Print JSON (stable keys) instead of a table.",
    )(fn)


def cli_operator() -> Operator:
    """Who acts from the command line, for the run's audit trail: the OS
    user, on this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a bare container)
        user = f"uid {os.getuid()}"
    return Operator(user, socket.gethostname())


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (``--json``); unknown types as strings."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
