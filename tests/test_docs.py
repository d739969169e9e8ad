"""Every public name of pikku_celery has a docstring (issue 6, must-show 5).

Walks ``pikku_celery.__all__`` and every public module of the package: each
public class, function, method and property (a name without a leading ``_``
that the module defines or lists in ``__all__``) must say what it is for.

A method that overrides a documented method of a pikku_celery base class, or
implements one of a pikku_celery ``Protocol`` the class provides in full (the
stores, lease services and dispatchers satisfy theirs structurally, without
subclassing), is documented there, as ``help()`` would show for a subclass.
An override of a third-party hook (Django, kombu, click) needs its own.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import click

import pikku_celery
from pikku_celery.engine.dispatcher import Dispatcher
from pikku_celery.model.slots import ConcurrencySlots
from pikku_celery.ports.lease import LeaseService
from pikku_celery.ports.store import WorkflowStore

PACKAGE = "pikku_celery"
PROTOCOLS: tuple[type, ...] = (WorkflowStore, LeaseService, Dispatcher, ConcurrencySlots)


def public_modules() -> tuple[list[types.ModuleType], list[str]]:
    """The package's public modules, and the ones that could not be imported here.

    A Django module that needs configured settings to import is reported as
    skipped rather than failing the walk (none needs them today).
    """
    modules = [pikku_celery]
    skipped: list[str] = []
    for info in pkgutil.walk_packages(pikku_celery.__path__, f"{PACKAGE}."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue  # private modules and __main__ (importing it runs the CLI)
        try:
            modules.append(importlib.import_module(info.name))
        except Exception as exc:
            from django.core.exceptions import AppRegistryNotReady, ImproperlyConfigured

            if ".contrib.django" in info.name and isinstance(
                exc, ImproperlyConfigured | AppRegistryNotReady
            ):
                skipped.append(f"{info.name}: {exc}")
                continue
            raise
    return modules, skipped


def own_doc(obj: Any) -> str:
    """The docstring written for ``obj`` itself, not one Python generated."""
    if isinstance(obj, click.Command):
        return obj.help or ""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__") or ""
        # dataclasses and NamedTuples make up "Name(field, ...)" when none is written.
        return "" if doc.startswith(f"{obj.__name__}(") else doc
    return getattr(obj, "__doc__", None) or ""


def protocol_methods(protocol: type) -> set[str]:
    """The public methods a ``Protocol`` asks for."""
    return {n for n, v in vars(protocol).items() if not n.startswith("_") and callable(v)}


def implemented_protocols(cls: type) -> list[type]:
    """The pikku_celery protocols ``cls`` provides every method of, or, for a
    part of an adapter (a mixin such as the SQL store's sweep), those a class
    built on it provides: its methods are that class's implementation."""
    composed = [cls, *_subclasses(cls)]
    return [
        p
        for p in PROTOCOLS
        if p not in cls.__mro__
        and any(all(callable(getattr(c, n, None)) for n in protocol_methods(p)) for c in composed)
    ]


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def member_doc(cls: type, name: str, member: Any) -> str:
    """A method's or property's docstring, or that of the pikku_celery method it overrides."""
    target = member.__func__ if isinstance(member, staticmethod | classmethod) else member
    doc = getattr(target, "__doc__", None) or ""
    if doc.strip():
        return doc
    for base in [*cls.__mro__[1:], *implemented_protocols(cls)]:
        if base.__module__.startswith(PACKAGE) and name in base.__dict__:
            inherited = base.__dict__[name]
            if isinstance(inherited, staticmethod | classmethod):
                inherited = inherited.__func__
            doc = getattr(inherited, "__doc__", None) or ""
            if doc.strip():
                return doc
    return ""


def is_documentable(obj: Any) -> bool:
    """Classes, functions and click commands; constants and type aliases are not.

    Judged by ``type(obj)`` alone: ``isinstance`` would consult ``__class__``,
    which sets up a lazy object such as Django's ``settings``.
    """
    kind = type(obj)
    return issubclass(kind, type | click.Command) or kind is types.FunctionType


def qualified_name(obj: Any) -> str:
    """Where ``obj`` is defined: ``module.QualName`` (a click command's callback's)."""
    target: Any = obj.callback if isinstance(obj, click.Command) else obj
    return f"{target.__module__}.{target.__qualname__}"


def defined_in(obj: Any, module: types.ModuleType) -> bool:
    """Whether ``module`` is where ``obj`` is defined (not merely imported)."""
    target = obj.callback if isinstance(obj, click.Command) else obj
    return getattr(target, "__module__", None) == module.__name__


def public_names(module: types.ModuleType) -> Iterator[tuple[str, Any]]:
    """``__all__`` and every public name the module defines."""
    listed = set(getattr(module, "__all__", ()))
    for name in sorted(listed | set(vars(module))):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if is_documentable(obj) and (name in listed or defined_in(obj, module)):
            yield name, obj


def class_offenders(cls: type, where: str) -> Iterator[str]:
    """Public methods, properties and nested classes of ``cls`` without a docstring."""
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property | cached_property):
            kind = "property"
        elif inspect.isfunction(member) or isinstance(member, staticmethod | classmethod):
            kind = "method"
        elif inspect.isclass(member) and member.__qualname__.startswith(f"{cls.__qualname__}."):
            if not own_doc(member).strip():
                yield f"class {where}.{name}"
            yield from class_offenders(member, f"{where}.{name}")
            continue
        else:
            continue
        if not member_doc(cls, name, member).strip():
            yield f"{kind} {where}.{name}"


def undocumented(modules: list[types.ModuleType]) -> list[str]:
    """Every public module, class, function, method and property lacking a docstring."""
    offenders: list[str] = []
    seen: set[int] = set()
    for module in modules:
        if not (module.__doc__ or "").strip():
            offenders.append(f"module {module.__name__}")
        for _name, obj in public_names(module):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            where = qualified_name(obj)
            if not own_doc(obj).strip():
                kind = "class" if inspect.isclass(obj) else "function"
                offenders.append(f"{kind} {where}")
            if inspect.isclass(obj):
                offenders.extend(class_offenders(obj, where))
    return sorted(set(offenders))


def test_the_walk_finds_the_public_modules() -> None:
    modules, skipped = public_modules()
    names = {m.__name__ for m in modules}
    for expected in (
        "pikku_celery.lease",
        "pikku_celery.store",
        "pikku_celery.engine",
        "pikku_celery.celery",
        "pikku_celery.broker",
        "pikku_celery.contrib.flask",
        "pikku_celery.cli",
        "pikku_celery.testing",
        "pikku_celery.sql.engines",
        "pikku_celery.payload",
        "pikku_celery.errors",
    ):
        assert expected in names
    assert "pikku_celery.cli.__main__" not in names
    assert "pikku_celery.contrib.django.conf" in names or skipped


def test_every_name_in_the_top_level_all_has_a_docstring() -> None:
    offenders = undocumented([pikku_celery])
    assert not offenders, "without a docstring:\n  " + "\n  ".join(offenders)


def test_every_public_name_has_a_docstring() -> None:
    modules, _skipped = public_modules()
    offenders = undocumented(modules)
    assert not offenders, f"{len(offenders)} without a docstring:\n  " + "\n  ".join(offenders)
