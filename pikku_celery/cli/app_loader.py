"""``-A/--app``: find the app's :class:`~pikku_celery.Pikku` the way ``celery -A`` finds its app.

``MODULE:ATTR`` names it; ``MODULE`` alone is searched for a module attribute
that is a Pikku (then, for a package, its ``celery`` and ``app`` submodules);
``MODULE.ATTR`` works too. An attribute that is the Celery app is accepted
when a Pikku was built on it. The current directory is importable, as with
Celery, so ``-A proj`` works from the project's root.

Then the modules ``celery worker`` imports (``include=``, ``imports``,
``autodiscover_tasks``, Django's apps) are imported too, so every command
sees the workflows and tasks a worker of the app has.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any, cast

import click
import sqlalchemy as sa
from celery import Celery

from ..celery.integration import Pikku
from ..errors import SchemaMissingError
from .errors import ServiceError, first_line

SUBMODULES = ("celery", "app")


class AppLoadError(click.ClickException):
    """The ``-A`` spec names no importable Pikku: a usage error, exit code 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(f"-A/--app: {message}")


def load_pikku(spec: str) -> Pikku:
    """The Pikku named by ``spec`` (``module``, ``module:attr`` or ``module.attr``),
    with the modules Celery imports for its app imported."""
    pikku = _find_pikku(spec)
    try:
        pikku.registry.load()
    except Exception as exc:
        raise _failure(
            f"importing the task modules of Celery app {pikku.app.main!r}", exc
        ) from None
    return pikku


def _find_pikku(spec: str) -> Pikku:
    spec = spec.strip()
    module_name, colon, attr = spec.partition(":")
    if not module_name or (colon and not attr):
        raise AppLoadError(f"{spec!r} is not MODULE or MODULE:ATTR")
    _cwd_importable()
    if attr:
        module = _import(module_name)
        if module is None:
            raise AppLoadError(_not_found(module_name))
        return _pikku_from(_attribute(module, attr), spec)
    module = _import(module_name)
    if module is not None:
        return _search(module)
    parent, _, last = module_name.rpartition(".")
    owner = _import(parent) if parent else None
    if owner is None:
        raise AppLoadError(_not_found(module_name))
    return _pikku_from(_attribute(owner, last, missing=_not_found(module_name)), spec)


def _cwd_importable() -> None:
    # A console script's sys.path lacks the current directory; celery -A adds it.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _not_found(name: str) -> str:
    return (
        f"no module named {name!r} (run from the project's directory, or put it on PYTHONPATH; "
        "-A takes MODULE or MODULE:ATTR, as celery -A does)"
    )


def _failure(what: str, exc: Exception) -> click.ClickException:
    """An error raised by the app's own code while it loads, as one clean line."""
    if isinstance(exc, click.ClickException):
        return exc
    if isinstance(exc, SchemaMissingError):
        return ServiceError(f"{what}: {exc}")
    if isinstance(exc, sa.exc.SQLAlchemyError):
        # The driver's message names host and port, never the password.
        return ServiceError(f"{what}: the app's database is unreachable: {first_line(exc)}")
    return AppLoadError(f"{what} failed: {type(exc).__name__}: {first_line(exc)}")


def _import(name: str) -> ModuleType | None:
    """The module, or None when ``name`` itself does not exist.

    A module that exists but fails to import (a missing dependency inside it,
    an unreachable database) is an error of its own, named as such.
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise AppLoadError(f"importing {name!r} failed: {exc}") from None
    except Exception as exc:
        raise _failure(f"importing {name!r}", exc) from None


def _attribute(module: ModuleType, path: str, missing: str | None = None) -> Any:
    """``module.path`` (dotted); module ``__getattr__`` hooks run, errors named."""
    obj: Any = module
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            message = missing or f"module {module.__name__!r} has no attribute {path!r}"
            raise AppLoadError(message) from None
        except Exception as exc:
            raise _failure(f"reading {module.__name__}:{path}", exc) from None
    return obj


def _pikku_from(obj: Any, spec: str) -> Pikku:
    if isinstance(obj, Pikku):
        return obj
    if isinstance(obj, Celery):
        found = _pikku_for_app(obj)
        if found is None:
            raise AppLoadError(
                f"{spec} is a Celery app, but no Pikku(app, ...) built on it was found; "
                "point -A at the Pikku instance (MODULE:ATTR)"
            )
        return found
    raise AppLoadError(f"{spec} is a {type(obj).__name__}, not a pikku_celery.Pikku")


def _pikkus_in(module: ModuleType) -> dict[str, Pikku]:
    found: dict[str, Pikku] = {}
    for name, value in vars(module).items():
        if isinstance(value, Pikku) and all(value is not v for v in found.values()):
            found[name] = value
    return found


def _search(module: ModuleType) -> Pikku:
    name = module.__name__
    looked = [name]
    found = _pikkus_in(module)
    if not found and hasattr(module, "__path__"):
        for sub in SUBMODULES:
            submodule = _import(f"{name}.{sub}")
            if submodule is None:
                continue
            looked.append(submodule.__name__)
            found = _pikkus_in(submodule)
            if found:
                break
    if not found:
        for value in list(vars(module).values()):
            if isinstance(value, Celery) and (bound := _pikku_for_app(value)) is not None:
                return bound
        raise AppLoadError(
            f"no Pikku instance found: looked for a module attribute that is a "
            f"pikku_celery.Pikku (like `pikku = Pikku(app, ...)`) in {', '.join(looked)}; "
            f"name it with -A {name}:ATTR"
        )
    if len(found) > 1:
        if "pikku" in found:
            return found["pikku"]
        names = ", ".join(f"{name}:{attr}" for attr in sorted(found))
        raise AppLoadError(f"several Pikku instances in {name!r}: choose one of {names}")
    return next(iter(found.values()))


def _pikku_for_app(app: Celery) -> Pikku | None:
    """A Pikku built on ``app``, in any loaded module.

    ``type()`` rather than ``isinstance``: the latter asks lazy objects (Django's
    settings proxies) for their ``__class__``, which evaluates them.
    """
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if issubclass(type(value), Pikku) and value.app is app:
                return cast(Pikku, value)
    return None
