"""What every command shares: the app it works on, its options and its errors.

Errors reach the user as one clean line and a non-zero exit code, never a
traceback: 1 for a refused request (unknown run, settled run, bad payload), 2
for bad usage or an unreachable service (database, broker). Passwords of the
database and broker URLs are scrubbed from every message.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import click
import sqlalchemy as sa
from kombu.exceptions import OperationalError as BrokerOperationalError

from ..engine.core import parse_run_id
from ..errors import PikkuError, SchemaMissingError, StoreUnavailableError

if TYPE_CHECKING:
    from ..celery.integration import Pikku

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    # Newer click makes ParamType generic; older releases cannot subscript it.
    ParamTypeBase = click.ParamType[Any]
else:
    ParamTypeBase = click.ParamType


class ServiceError(click.ClickException):
    """A database or broker could not be reached or used: exit code 2."""

    exit_code = 2


def masked(url: str | sa.URL) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable database URL>"


def url_password(url: str | sa.URL | None) -> str | None:
    """The password in a database URL, if any (so it can be scrubbed)."""
    if not url:
        return None
    try:
        password = sa.make_url(url).password
    except sa.exc.ArgumentError:
        return None
    return str(password) if password else None


def first_line(exc: BaseException) -> str:
    """The first line of an error: drivers append SQL and hints below it."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret (a database password) replaced by ``***``."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def fail(url: str, exc: BaseException) -> ServiceError:
    """A clean error for a database problem, the password never shown."""
    return ServiceError(f"{masked(url)}: {scrub(first_line(exc), [url_password(url) or ''])}")


@dataclass
class CliState:
    """``ctx.obj``: the ``-A`` spec, and the Pikku it names once loaded.

    Embedders (a Django management command) can hand a ready engine in with
    ``main.main(args, obj=CliState(pikku=engine))``.
    """

    app_spec: str | None = None
    pikku: Pikku | None = None

    def engine(self) -> Pikku:
        """The app's Pikku, imported on first use (``--help`` imports nothing)."""
        if self.pikku is None:
            if not self.app_spec:
                raise click.UsageError(
                    "this command needs your app: pass -A/--app MODULE[:ATTR] "
                    "(as with celery -A) or set PIKKU_APP"
                )
            from .app_loader import load_pikku

            self.pikku = load_pikku(self.app_spec)
        return self.pikku

    def secrets(self) -> list[str]:
        """Passwords of the app's database and broker URLs, to scrub from output."""
        found: list[str] = []
        if self.pikku is None:
            return found
        if self.pikku.sql_engine is not None:
            found.append(url_password(self.pikku.sql_engine.url) or "")
        for url in (self.pikku.app.conf.broker_url, self.pikku.app.conf.broker_write_url):
            if isinstance(url, str):
                with suppress(ValueError):
                    found.append(urlsplit(url).password or "")
        return [s for s in found if s]

    def database_label(self) -> str:
        """The app's database URL, masked, to prefix database errors with."""
        engine = self.pikku.sql_engine if self.pikku is not None else None
        return masked(engine.url) if engine is not None else "workflow store"


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


def echo_json(data: Any) -> None:
    """Print ``data`` as indented JSON (``--json``); unknown types as strings."""
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))
