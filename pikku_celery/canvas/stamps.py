"""A canvas node's stamps (Celery's stamping API), read from its signature.

``sig.stamp(visitor=...)`` sets each stamp as an option of the signature
and lists their names in its ``stamped_headers`` option. When Celery applies
a chain, group or chord, it merges the composite's options into each
member's, a member's own ``stamped_headers`` (and so its stamps) kept: a
task node has its own stamps or, with none, those of the innermost
composite around it that has some.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.canvas import Signature

from ..errors import CanvasError
from ..payload import check_json

STAMPED_HEADERS = "stamped_headers"
"""The option that lists a signature's stamps by name (Celery's)."""


def stamps_of(sig: Signature, path: str) -> dict[str, Any]:
    """``sig``'s own stamps, name to value; :class:`CanvasError` for a stamp
    that is no name or whose value JSON cannot carry."""
    names = sig.options.get(STAMPED_HEADERS) or []
    if isinstance(names, str):
        names = [names]
    stamps: dict[str, Any] = {}
    for name in names:
        if not isinstance(name, str) or not name:
            raise CanvasError(f"{path}: stamp name {name!r} is not a header name")
        value = sig.options.get(name)
        check_json(value, f"canvas node {path}", f"stamp {name!r}")
        stamps[name] = value
    return stamps


class Stamps:
    """The stamps of the innermost composite being compiled that has some."""

    def __init__(self) -> None:
        self.inherited: dict[str, Any] = {}

    @contextmanager
    def around(self, stamps: dict[str, Any]) -> Iterator[None]:
        """While compiling a composite with these stamps of its own."""
        outer = self.inherited
        self.inherited = stamps or outer
        try:
            yield
        finally:
            self.inherited = outer

    def of_task(self, own: dict[str, Any]) -> dict[str, Any]:
        """A task's stamps: its own, else those it inherits."""
        return own or dict(self.inherited)
