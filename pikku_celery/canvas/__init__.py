"""Durable canvas: an existing Celery chain, group or chord run as one stored graph run.

``pikku.durable(chain(a.s(1), b.s()))`` compiles the canvas into a JSON plan
(:mod:`.plan`), stores it as the input of a run of the built-in
``pikku.canvas`` workflow (:mod:`.interpret`), and returns a
:class:`CanvasRun`. Each node runs as a step of that run. Reading a stored
plan (:mod:`.shape`, :mod:`.names`) needs no Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_attributes
from .names import WORKFLOW

if TYPE_CHECKING:
    from ..errors import CanvasError
    from .handle import CanvasRun
    from .start import start
    from .tasks import install

_LAZY = {
    "CanvasError": "..errors",
    "CanvasRun": ".handle",
    "install": ".tasks",
    "start": ".start",
}

__all__ = ["WORKFLOW", "CanvasError", "CanvasRun", "install", "start"]

__getattr__ = lazy_attributes(__name__, _LAZY)
