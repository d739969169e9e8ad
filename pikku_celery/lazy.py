"""Package attributes imported on first use (PEP 562).

A package ``__init__`` names what it exports; the heavy ones (the Celery
integration, the SQL and Redis adapters) are imported only when first
touched, so importing the engine or the in-memory adapters loads none of
their libraries.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``name`` from ``where[name]`` (relative
    to ``package``) on first use, then keeping it in the package."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    return __getattr__
